package idemotel

import (
	"context"
	"reflect"
	"sync"
	"sync/atomic"

	"github.com/seed094d4201/idem"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// metrics are the instruments, and the counts behind the observable ones,
// of every store with one name on one MeterProvider: the SDK answers a
// second registration of an instrument with the first, and of two
// callbacks observing one attribute set only one value would count, so
// such stores share one set and their counts add up.
type metrics struct {
	calls     [idem.OutcomeRefused + 1]atomic.Int64
	executing atomic.Int64

	took        metric.Float64Histogram
	swept       metric.Int64Counter
	sweepErrors metric.Int64Counter

	// Options made once, so that recording allocates nothing.
	recordByOutcome [idem.OutcomeRefused + 1][]metric.RecordOption
	store           []metric.AddOption
}

type metricsKey struct {
	mp    metric.MeterProvider
	store string
}

var (
	sharedMu sync.Mutex
	shared   = map[metricsKey]*metrics{} // guarded by sharedMu; never shrinks: one entry per provider and name
)

// metricsFor returns the metrics of the stores named store on mp, made
// and registered on first use. A provider of a type that cannot be a map
// key gets a set of its own each time.
func metricsFor(mp metric.MeterProvider, store string) (*metrics, error) {
	if !reflect.ValueOf(mp).Comparable() { // the value: an interface field may hold what cannot be hashed
		return newMetrics(mp, store)
	}
	k := metricsKey{mp, store}
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if m, ok := shared[k]; ok {
		return m, nil
	}
	m, err := newMetrics(mp, store)
	if err != nil {
		return nil, err
	}
	shared[k] = m
	return m, nil
}

func newMetrics(mp metric.MeterProvider, store string) (*metrics, error) {
	m := &metrics{}
	var storeAttrs []attribute.KeyValue
	if store != "" {
		storeAttrs = append(storeAttrs, attribute.String("idem.store", store))
	}
	storeSet := metric.WithAttributeSet(attribute.NewSet(storeAttrs...))
	m.store = []metric.AddOption{storeSet}
	var observeByOutcome [idem.OutcomeRefused + 1][]metric.ObserveOption
	for out := idem.OutcomeExecuted; out <= idem.OutcomeRefused; out++ {
		set := metric.WithAttributeSet(attribute.NewSet(append([]attribute.KeyValue{attribute.String("idem.outcome", out.String())}, storeAttrs...)...))
		m.recordByOutcome[out] = []metric.RecordOption{set}
		observeByOutcome[out] = []metric.ObserveOption{set}
	}

	// Calls and work in flight are counted in atomics and read when the
	// metrics are collected: a replay pays for an atomic add, not for a
	// measurement.
	meter := mp.Meter(scope, metric.WithInstrumentationVersion(version()))
	var err error
	if _, err = meter.Int64ObservableCounter("idem.calls", metric.WithUnit("{call}"),
		metric.WithDescription("Calls with an idempotency key, by outcome."),
		metric.WithInt64Callback(func(_ context.Context, obs metric.Int64Observer) error {
			for out := idem.OutcomeExecuted; out <= idem.OutcomeRefused; out++ {
				obs.Observe(m.calls[out].Load(), observeByOutcome[out]...)
			}
			return nil
		})); err != nil {
		return nil, err
	}
	if _, err = meter.Int64ObservableUpDownCounter("idem.executions", metric.WithUnit("{execution}"),
		metric.WithDescription("Work in flight under a claim in this process."),
		metric.WithInt64Callback(func(_ context.Context, obs metric.Int64Observer) error {
			obs.Observe(m.executing.Load(), storeSet)
			return nil
		})); err != nil {
		return nil, err
	}
	if m.took, err = meter.Float64Histogram("idem.call.duration", metric.WithUnit("s"),
		metric.WithExplicitBucketBoundaries(durationBounds...),
		metric.WithDescription("How long calls that ran the work took (executed, released), and how long coalesced calls waited.")); err != nil {
		return nil, err
	}
	if m.swept, err = meter.Int64Counter("idem.sweep.removed", metric.WithUnit("{key}"),
		metric.WithDescription("Expired outcomes removed by sweeps.")); err != nil {
		return nil, err
	}
	if m.sweepErrors, err = meter.Int64Counter("idem.sweep.errors", metric.WithUnit("{sweep}"),
		metric.WithDescription("Sweeps that failed.")); err != nil {
		return nil, err
	}
	return m, nil
}
