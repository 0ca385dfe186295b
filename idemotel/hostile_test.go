package idemotel_test

import (
	"context"
	"errors"
	"testing"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemotel"
)

func TestHostileNilProviders(t *testing.T) {
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
