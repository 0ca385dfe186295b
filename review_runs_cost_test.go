package idem

import (
	"context"
	"strconv"
	"testing"
	"time"
)

// After a shard holds maxRuns expiry runs (eight backward clock steps
// within one TTL: a VM with a bad clock source, NTP stepping a drifting
// host), a completion whose expiry falls before the last run's tail is
// inserted with an unbounded walk (addToRuns: last.insert(e, -1)) from the
// tail, under the shard's lock. After one more step back, every
// completion walks past every entry completed while the clock was ahead:
// each completion costs O(n) in the shard's size, with claims on that
// shard waiting behind it, for as long as the step back lasts (up to a
// TTL). The cost of a completion must not depend on how many keys the
// shard holds.
func TestReviewExpiryRunsCompletionCostAfterClockSteps(t *testing.T) {
	clock := newFakeClock()
	s := newStore[int](t, Options{TTL: time.Minute, Now: clock.Now, SweepInterval: -1})
	target := s.table.shard("seed")
	n := 0
	keys := func(count int) []string { // keys of target's shard, fresh each call
		out := make([]string, 0, count)
		for len(out) < count {
			n++
			k := "k" + strconv.Itoa(n)
			if s.table.shard(k) == target {
				out = append(out, k)
			}
		}
		return out
	}
	complete := func(ks []string) time.Duration {
		start := time.Now()
		for _, k := range ks {
			if _, err := s.RunOnce(context.Background(), k, "p", func(context.Context) (int, error) { return 1, nil }); err != nil {
				t.Fatal(err)
			}
		}
		return time.Since(start)
	}
	base := clock.Now()
	at := func(d time.Duration) { clock.mu.Lock(); clock.now = base.Add(d); clock.mu.Unlock() }

	// Eight runs: each step back finds more than runWalk later entries.
	for i := maxRuns + 1; i > 1; i-- {
		at(time.Duration(i) * time.Hour)
		complete(keys(runWalk + 2))
	}
	if got := len(target.runs); got != maxRuns {
		t.Fatalf("setup: %d runs, want %d", got, maxRuns)
	}
	// The clock ahead: many completions at the last run's tail.
	at(20 * time.Hour)
	complete(keys(30000))
	const m = 1000
	at(21 * time.Hour)
	fast := complete(keys(m)) // at the tail: no walk
	at(1 * time.Hour)         // one more step back
	slow := complete(keys(m)) // each walks past every later entry
	t.Logf("%d completions at the tail: %v; after a step back: %v", m, fast, slow)
	if slow > 10*fast+20*time.Millisecond {
		t.Fatalf("after a clock step back, %d completions took %v against %v at the tail: each completion walks the shard's whole run (O(n) under the shard lock)", m, slow, fast)
	}
}
