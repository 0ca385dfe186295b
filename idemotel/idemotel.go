// Package idemotel reports what an idem Store does to OpenTelemetry: it
// makes an idem.Observer that records metrics and spans.
//
// Metrics:
//
//   - idem.calls (counter, {call}): calls with a key, by outcome
//     (idem.outcome: executed, released, replayed, coalesced, mismatch,
//     in_progress, outcome_unknown, backend_error, refused).
//   - idem.call.duration (histogram, s): how long the calls that ran the
//     work took (executed, released), and how long coalesced calls
//     waited, in buckets from 5 microseconds to 10 seconds.
//   - idem.executions (up-down counter, {execution}): work in flight in
//     this process.
//   - idem.sweep.removed (counter, {key}): expired outcomes removed by
//     sweeps, and idem.sweep.errors (counter, {sweep}): sweeps that failed.
//
// Spans: idem.execute around the work a call owns (the work's context is
// the span's), with idem.claim and idem.record around the Backend's claim
// and the recording of the outcome. A span's status is Error only for what
// failed in its phase; how the call ended is the attribute idem.outcome,
// set on idem.execute for a call that ran the work, and on the span
// current in the caller's context (its server span, say) for one that did
// not: a replay, a coalesced wait, a mismatch. Spans and metrics carry the
// store's name (Options.Store) and, on spans, the key's SHA-256
// (idem.key.hash), or the key itself (idem.key) when Options.RawKeys is
// set: keys may be personal or secret, so they stay out of telemetry
// unless asked for. The meter and tracer carry this module's version.
package idemotel

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"runtime/debug"
	"time"

	"github.com/seed094d4201/idem"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

const scope = "github.com/seed094d4201/idem/idemotel"

// durationBounds are idem.call.duration's bucket boundaries, in seconds:
// from 5 microseconds (a replay in memory) to 10 seconds (a claim that
// waited out a Backend), the semantic conventions' HTTP advice below one
// second included.
var durationBounds = []float64{
	0.000005, 0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005,
	0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75,
	1, 2.5, 5, 7.5, 10,
}

// Options configure NewObserver. Every zero field means the default it
// documents.
type Options struct {
	// Store names the store in every metric and span (attribute
	// idem.store), for services with several. Empty means none. Stores
	// that share a name on one MeterProvider share its metrics: their
	// counts add up.
	Store string

	// MeterProvider and TracerProvider receive the metrics and spans. Nil
	// means the global ones (otel.GetMeterProvider, otel.GetTracerProvider).
	MeterProvider  metric.MeterProvider
	TracerProvider trace.TracerProvider

	// RawKeys puts keys on spans as they are (idem.key). False means their
	// SHA-256 (idem.key.hash), since a key may carry personal data.
	RawKeys bool
}

// NewObserver returns an Observer that reports to OpenTelemetry, for
// idem.Options.Observer.
func NewObserver(opts Options) (*idem.Observer, error) {
	mp, tp := opts.MeterProvider, opts.TracerProvider
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	m, err := metricsFor(mp, opts.Store)
	if err != nil {
		return nil, err
	}
	o := &observer{opts: opts, m: m, tracer: tp.Tracer(scope, trace.WithInstrumentationVersion(version()))}
	return &idem.Observer{Call: o.call, Executing: o.executingDelta, Span: o.span, Sweep: o.sweep}, nil
}

type observer struct {
	opts   Options
	m      *metrics
	tracer trace.Tracer
}

func (o *observer) call(ctx context.Context, _ string, out idem.Outcome, d time.Duration) {
	if out < idem.OutcomeExecuted || out > idem.OutcomeRefused {
		return
	}
	o.m.calls[out].Add(1)
	switch out {
	case idem.OutcomeExecuted, idem.OutcomeReleased, idem.OutcomeCoalesced: // executions and waits
		o.m.took.Record(ctx, d.Seconds(), o.m.recordByOutcome[out]...)
	}
	// The span the call ran under says how it ended: idem.execute for a
	// call that ran the work, the caller's own (a server span) otherwise.
	if sp := trace.SpanFromContext(ctx); sp.IsRecording() {
		sp.SetAttributes(attribute.String("idem.outcome", out.String()))
	}
}

func (o *observer) executingDelta(_ context.Context, delta int) { o.m.executing.Add(int64(delta)) }

func (o *observer) sweep(ctx context.Context, removed int, err error) {
	o.m.swept.Add(ctx, int64(removed), o.m.store...)
	if err != nil {
		o.m.sweepErrors.Add(ctx, 1, o.m.store...)
	}
}

// span starts a span for a phase; its status is Error only for what failed
// in that phase (idem's Observer passes nil for a claim that found a
// replay or a mismatch, and for a record that wrote its outcome).
func (o *observer) span(ctx context.Context, phase, key string) (context.Context, func(error)) {
	attrs := make([]attribute.KeyValue, 0, 2)
	var hash string
	if o.opts.RawKeys {
		attrs = append(attrs, attribute.String("idem.key", key))
	} else {
		sum := sha256.Sum256([]byte(key))
		hash = hex.EncodeToString(sum[:])
		attrs = append(attrs, attribute.String("idem.key.hash", hash))
	}
	if o.opts.Store != "" {
		attrs = append(attrs, attribute.String("idem.store", o.opts.Store))
	}
	ctx, sp := o.tracer.Start(ctx, phase, trace.WithAttributes(attrs...))
	return ctx, func(err error) {
		if err != nil {
			o.failSpan(sp, key, hash, err)
		}
		sp.End()
	}
}

// version is this module's version, for the meter's and tracer's
// instrumentation scope: the one the build chose, or "devel" in a build of
// the module itself.
func version() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == module {
				return d.Version
			}
		}
		if bi.Main.Path == module && bi.Main.Version != "" {
			return bi.Main.Version
		}
	}
	return "devel"
}

const module = "github.com/seed094d4201/idem"
