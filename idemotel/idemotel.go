// Package idemotel reports what an idem Store does to OpenTelemetry: it
// makes an idem.Observer that records metrics and spans.
//
// Metrics:
//
//   - idem.calls (counter): calls with a key, by outcome (executed,
//     released, replayed, coalesced, mismatch, in_progress, outcome_unknown,
//     backend_error, refused).
//   - idem.call.duration (histogram, seconds): how long the calls that ran
//     the work took (executed, released), and how long coalesced calls
//     waited.
//   - idem.executions (up-down counter): work in flight in this process.
//   - idem.sweep.removed (counter): expired outcomes removed by sweeps,
//     and idem.sweep.errors (counter).
//
// Spans: idem.execute around the work a call owns (the work's context is
// the span's), with idem.claim and idem.record around the Backend's claim
// and the recording of the outcome. Spans and metrics carry the store's
// name (Options.Store) and, on spans, the key's SHA-256 (idem.key.hash), or
// the key itself (idem.key) when Options.RawKeys is set: keys may be
// personal or secret, so they stay out of telemetry unless asked for.
package idemotel

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"sync/atomic"
	"time"

	"github.com/seed094d4201/idem"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

const scope = "github.com/seed094d4201/idem/idemotel"

// Options configure NewObserver. Every zero field means the default it
// documents.
type Options struct {
	// Store names the store in every metric and span (attribute
	// idem.store), for services with several. Empty means none.
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
	o := &observer{opts: opts, tracer: tp.Tracer(scope)}
	storeAttrs := []attribute.KeyValue{}
	if opts.Store != "" {
		storeAttrs = append(storeAttrs, attribute.String("idem.store", opts.Store))
	}
	store := metric.WithAttributeSet(attribute.NewSet(storeAttrs...))
	o.store = []metric.AddOption{store}
	var observeByOutcome [idem.OutcomeRefused + 1][]metric.ObserveOption
	for out := idem.OutcomeExecuted; out <= idem.OutcomeRefused; out++ {
		set := metric.WithAttributeSet(attribute.NewSet(append([]attribute.KeyValue{attribute.String("idem.outcome", out.String())}, storeAttrs...)...))
		o.recordByOutcome[out] = []metric.RecordOption{set}
		observeByOutcome[out] = []metric.ObserveOption{set}
	}

	// Calls and work in flight are counted in atomics and read when the
	// metrics are collected: a replay pays for an atomic add, not for a
	// measurement.
	meter := mp.Meter(scope)
	var err error
	_, err = meter.Int64ObservableCounter("idem.calls",
		metric.WithDescription("Calls with an idempotency key, by outcome."),
		metric.WithInt64Callback(func(_ context.Context, obs metric.Int64Observer) error {
			for out := idem.OutcomeExecuted; out <= idem.OutcomeRefused; out++ {
				obs.Observe(o.calls[out].Load(), observeByOutcome[out]...)
			}
			return nil
		}))
	if err != nil {
		return nil, err
	}
	_, err = meter.Int64ObservableUpDownCounter("idem.executions",
		metric.WithDescription("Work in flight under a claim in this process."),
		metric.WithInt64Callback(func(_ context.Context, obs metric.Int64Observer) error {
			obs.Observe(o.executing.Load(), store)
			return nil
		}))
	if err != nil {
		return nil, err
	}
	if o.took, err = meter.Float64Histogram("idem.call.duration", metric.WithUnit("s"),
		metric.WithDescription("How long calls that ran the work took (executed, released), and how long coalesced calls waited.")); err != nil {
		return nil, err
	}
	if o.swept, err = meter.Int64Counter("idem.sweep.removed", metric.WithDescription("Expired outcomes removed by sweeps.")); err != nil {
		return nil, err
	}
	if o.sweepErrors, err = meter.Int64Counter("idem.sweep.errors", metric.WithDescription("Sweeps that failed.")); err != nil {
		return nil, err
	}
	return &idem.Observer{Call: o.call, Executing: o.executingDelta, Span: o.span, Sweep: o.sweep}, nil
}

type observer struct {
	opts        Options
	tracer      trace.Tracer
	calls       [idem.OutcomeRefused + 1]atomic.Int64
	executing   atomic.Int64
	took        metric.Float64Histogram
	swept       metric.Int64Counter
	sweepErrors metric.Int64Counter

	// Options made once, so that recording allocates nothing.
	recordByOutcome [idem.OutcomeRefused + 1][]metric.RecordOption
	store           []metric.AddOption
}

func (o *observer) call(ctx context.Context, _ string, out idem.Outcome, d time.Duration) {
	if out < idem.OutcomeExecuted || out > idem.OutcomeRefused {
		return
	}
	o.calls[out].Add(1)
	switch out {
	case idem.OutcomeExecuted, idem.OutcomeReleased, idem.OutcomeCoalesced: // executions and waits
		o.took.Record(ctx, d.Seconds(), o.recordByOutcome[out]...)
	}
}

func (o *observer) executingDelta(_ context.Context, delta int) { o.executing.Add(int64(delta)) }

func (o *observer) sweep(ctx context.Context, removed int, err error) {
	o.swept.Add(ctx, int64(removed), o.store...)
	if err != nil {
		o.sweepErrors.Add(ctx, 1, o.store...)
	}
}

func (o *observer) span(ctx context.Context, phase, key string) (context.Context, func(error)) {
	attrs := make([]attribute.KeyValue, 0, 2)
	if o.opts.RawKeys {
		attrs = append(attrs, attribute.String("idem.key", key))
	} else {
		sum := sha256.Sum256([]byte(key))
		attrs = append(attrs, attribute.String("idem.key.hash", hex.EncodeToString(sum[:])))
	}
	if o.opts.Store != "" {
		attrs = append(attrs, attribute.String("idem.store", o.opts.Store))
	}
	ctx, sp := o.tracer.Start(ctx, phase, trace.WithAttributes(attrs...))
	return ctx, func(err error) {
		if err != nil {
			sp.RecordError(err)
			sp.SetStatus(codes.Error, err.Error())
		}
		sp.End()
	}
}
