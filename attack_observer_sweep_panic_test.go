package idem

import (
	"context"
	"testing"
	"time"
)

// The Observer's functions are documented (observer.go) as user code whose
// panic "is logged and dropped, so that it can neither strand a key nor
// crash the process": Call, Executing and Span are recovered, but Sweep is
// called bare, so a panicking Observer.Sweep escapes Store.Sweep.
func TestAttackObserverSweepPanicEscapesSweep(t *testing.T) {
	s := newStore[int](t, Options{
		TTL: time.Hour, SweepInterval: -1,
		Observer: &Observer{Sweep: func(context.Context, int, error) { panic("observer bug") }},
	})
	defer func() {
		if v := recover(); v != nil {
			t.Fatalf("panic in Observer.Sweep escaped Store.Sweep: %v", v)
		}
	}()
	if _, err := s.Sweep(context.Background()); err != nil {
		t.Fatal(err)
	}
}
