package idem

import (
	"context"
	"runtime"
	"sync/atomic"
	"testing"
	"time"
)

// An Observer.Sweep that calls runtime.Goexit once (t.FailNow in a test
// helper) ends the background sweeper for good: a panic there is recovered
// and sweeping goes on, but a Goexit silently kills sweepLoop, so expired
// outcomes are never swept again (rule 8: bounded memory).
func TestAttackSweeperSurvivesObserverGoexit(t *testing.T) {
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
