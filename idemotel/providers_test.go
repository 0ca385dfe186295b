package idemotel_test

import (
	"context"
	"errors"
	"testing"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemotel"
	"github.com/stretchr/testify/assert"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
)

// A provider whose own type is not comparable.
type funcMP struct {
	noop.MeterProvider
	hook func()
}

// A comparable wrapper (struct with one interface field) holding that one:
// reflect says Comparable, yet hashing it as a map key panics; NewObserver
// takes it without a panic.
type wrapMP struct{ metric.MeterProvider }

func TestNewObserverTakesNonComparableProviders(t *testing.T) {
	_, err := idemotel.NewObserver(idemotel.Options{MeterProvider: funcMP{hook: func() {}}})
	assert.NoError(t, err)
	assert.NotPanics(t, func() {
		_, _ = idemotel.NewObserver(idemotel.Options{MeterProvider: wrapMP{funcMP{hook: func() {}}}})
	})
}

// An Observer made without providers (the global ones, no-op unless set)
// answers every call, an out-of-range Outcome among them, and a span's end
// may be called twice.
func TestObserverWithoutProvidersAnswersEveryCall(t *testing.T) {
	obs, err := idemotel.NewObserver(idemotel.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s := idem.New[int](idem.Options{Observer: obs, SweepInterval: -1})
	defer s.Close()
	for i := 0; i < 3; i++ {
		s.RunOnce(context.Background(), "k", nil, func(context.Context) (int, error) { return 1, nil })
		s.RunOnce(context.Background(), "e", nil, func(context.Context) (int, error) { return 0, errors.New("x") })
	}
	obs.Call(context.Background(), "k", idem.Outcome(0), 0)
	obs.Call(context.Background(), "k", idem.Outcome(200), 0)
	_, end := obs.Span(context.Background(), "idem.execute", "k")
	end(nil)
	end(errors.New("twice")) // a second end must not panic
	s.Sweep(context.Background())
}
