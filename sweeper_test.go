package idem

import (
	"context"
	"runtime"
	"sync/atomic"
	"testing"
	"time"
)

// An Observer.Sweep that calls runtime.Goexit once (t.FailNow in a test
// helper) does not end the background sweeper: as after a panic there,
// sweeping goes on and expired outcomes are still removed (rule 8: bounded
// memory). A Goexit used to end sweepLoop silently, for good.
func TestSweeperSurvivesObserverGoexit(t *testing.T) {
	clock := newFakeClock()
	var calls atomic.Int32
	s := newStore[int](t, Options{
		TTL:           time.Second,
		SweepInterval: 5 * time.Millisecond,
		Now:           clock.Now,
		Observer: &Observer{Sweep: func(context.Context, int, error) {
			if calls.Add(1) == 1 {
				runtime.Goexit()
			}
		}},
	})
	// Let the first sweep (which exits) run.
	deadline := time.Now().Add(2 * time.Second)
	for calls.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if calls.Load() == 0 {
		t.Fatal("sweeper never ran")
	}
	if _, err := s.RunOnce(context.Background(), "k", nil, func(context.Context) (int, error) { return 1, nil }); err != nil {
		t.Fatal(err)
	}
	clock.Advance(2 * time.Second)
	deadline = time.Now().Add(2 * time.Second)
	for s.Len() != 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if n := s.Len(); n != 0 {
		t.Fatalf("expired outcome still held after 2s of 5ms sweeps (Len %d, sweeps %d): the sweeper died", n, calls.Load())
	}
}

// The Observer's functions are documented (observer.go) as user code whose
// panic "is logged and dropped, so that it can neither strand a key nor
// crash the process": Sweep's too, so a panicking Observer.Sweep does not
// escape Store.Sweep (it was once called bare, unlike Call, Executing and
// Span).
func TestObserverSweepPanicStaysInSweep(t *testing.T) {
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
