package idem_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemtest"
	lc "github.com/seed094d4201/idem/internal/lifecycle"
)

// holdsExactly checks that s admits exactly n new keys at once, held in
// flight by tickets, and refuses the next with ErrFull; then lets them go.
func holdsExactly(t *testing.T, s *idem.Store[int], n int, prefix string) {
	t.Helper()
	ctx := context.Background()
	var tks []*idem.Ticket[int]
	defer func() {
		for _, tk := range tks {
			tk.Release()
		}
	}()
	for i := range n {
		tk, err := s.Begin(ctx, fmt.Sprintf("%s-%d", prefix, i), "p")
		if err != nil {
			t.Fatalf("new key %d of %d refused: %v (the count of keys held leaked)", i+1, n, err)
		}
		tks = append(tks, tk)
	}
	tk, err := s.Begin(ctx, prefix+"-over", "p")
	if err == nil {
		tks = append(tks, tk)
		if !tk.Replayed() {
			t.Fatalf("key %d admitted past MaxKeys %d (the count of keys held went below the keys held)", n+1, n)
		}
	} else if !errors.Is(err, idem.ErrFull) {
		t.Fatalf("key past MaxKeys: %v, want ErrFull", err)
	}
}

// Every move that takes a key out of memory (release, forget, expiry
// found by a claim, expiry by a sweep) gives its slot back exactly once:
// a store without a Backend still admits MaxKeys keys, and no more.
func TestMaxKeysCountsEveryMoveOutOfMemory(t *testing.T) {
	strays, _ := lc.Strays()
	clock := newFakeClock()
	const max = 3
	s := newStore[int](t, idem.Options{MaxKeys: max, TTL: time.Minute, SweepInterval: -1, Now: clock.Now})
	ctx := context.Background()
	ok := func(context.Context) (int, error) { return 1, nil }
	fail := func(context.Context) (int, error) { return 0, errors.New("transient") }
	for round := range 3 {
		// Release: a failure before commit.
		_, _ = s.RunOnce(ctx, fmt.Sprintf("r%d", round), "p", fail)
		// Forget of a completed key, twice (the second finds none).
		_, _ = s.RunOnce(ctx, fmt.Sprintf("f%d", round), "p", ok)
		for range 2 {
			if err := s.Forget(ctx, fmt.Sprintf("f%d", round)); err != nil {
				t.Fatal(err)
			}
		}
		// Expiry found by a claim of the same key, and by a sweep.
		_, _ = s.RunOnce(ctx, fmt.Sprintf("e%d", round), "p", ok)
		_, _ = s.RunOnce(ctx, fmt.Sprintf("w%d", round), "p", ok)
		clock.Advance(2 * time.Minute)
		if _, err := s.RunOnce(ctx, fmt.Sprintf("e%d", round), "p", ok); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Sweep(ctx); err != nil {
			t.Fatal(err)
		}
		clock.Advance(2 * time.Minute)
		// A completed key a full table sweeps to make room.
		for i := range max {
			_, _ = s.RunOnce(ctx, fmt.Sprintf("full%d-%d", round, i), "p", ok)
		}
		clock.Advance(2 * time.Minute)
		holdsExactly(t, s, max, fmt.Sprintf("held%d", round))
	}
	if n, last := lc.Strays(); n > strays {
		t.Fatalf("the store asked the lifecycle for %d moves it lacks (the last: %s)", n-strays, last)
	}
}

// With a Backend, memory holds keys in flight and pinned outcomes: a pin
// that the Backend takes gives its slot back once, whatever came first.
func TestMaxKeysCountsPinsTheBackendTakes(t *testing.T) {
	strays, _ := lc.Strays()
	var down atomic.Bool
	fault := func(op string) error {
		if down.Load() && op == "Complete" {
			return errLost
		}
		return nil
	}
	b := idemtest.Faulty{Backend: idemtest.NewMemoryBackend(), Fail: fault}
	const max = 3
	s := newStore[int](t, idem.Options{Backend: b, MaxKeys: max, SettleTimeout: 20 * time.Millisecond, SweepInterval: -1})
	ctx := context.Background()
	ok := func(context.Context) (int, error) { return 1, nil }
	for round := range 3 {
		down.Store(true)
		for i := range max {
			key := fmt.Sprintf("pin%d-%d", round, i)
			if _, err := s.RunOnce(ctx, key, "p", ok); err != nil {
				t.Fatal(err)
			}
		}
		// Pinned: memory is full, and a new key is refused.
		if _, err := s.RunOnce(ctx, fmt.Sprintf("more%d", round), "p", ok); !errors.Is(err, idem.ErrFull) {
			t.Fatalf("a new key while %d outcomes are pinned: %v, want ErrFull", max, err)
		}
		down.Store(false)
		waitFor(t, func() bool { return s.Len() == 0 }, "the pins to be taken by the backend")
		holdsExactly(t, s, max, fmt.Sprintf("held%d", round))
	}
	if n, last := lc.Strays(); n > strays {
		t.Fatalf("the store asked the lifecycle for %d moves it lacks (the last: %s)", n-strays, last)
	}
}
