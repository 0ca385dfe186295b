package idem

import (
	"context"
	"strconv"
	"testing"
	"time"
)

// After a shard holds runsTried expiry runs (eight backward clock steps
// within one TTL: a VM with a bad clock source, NTP stepping a drifting
// host), a completion whose expiry falls before every run's recent entries
// starts a run of its own. It used to be inserted with an unbounded walk
// from the last run's tail, under the shard's lock: after one more step
// back, every completion walked past every entry completed while the clock
// was ahead, O(n) in the shard's size (hostile review: 1000 completions
// took 130 ms against 2 ms). Checked by the shape it leaves, not by
// timing: the step back's completions are a new run, and every entry
// still expires at its own instant.
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
	for i := runsTried + 1; i > 1; i-- {
		at(time.Duration(i) * time.Hour)
		complete(keys(runWalk + 2))
	}
	if got := len(target.runs); got != runsTried {
		t.Fatalf("setup: %d runs, want %d", got, runsTried)
	}
	// The clock ahead: completions at the last run's tail.
	at(20 * time.Hour)
	complete(keys(300))
	at(21 * time.Hour)
	complete(keys(10))
	if got := len(target.runs); got != runsTried {
		t.Fatalf("completions in order started a run: %d runs", got)
	}
	at(1 * time.Hour) // one more step back
	back := keys(10)
	complete(back)
	if got := len(target.runs); got != runsTried+1 {
		t.Fatalf("after a step back past every run: %d runs, want a new one (%d)", got, runsTried+1)
	}
	last := target.runs[len(target.runs)-1]
	if last.head == nil || last.head.key != back[0] || last.tail.key != back[len(back)-1] {
		t.Fatal("the step back's completions are not the new run")
	}
	// The step back's keys expire at their own instant, a TTL after it.
	at(1*time.Hour + 2*time.Minute)
	removed, err := s.Sweep(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if removed < len(back) {
		t.Fatalf("a sweep past the step back's TTL removed %d, want at least %d", removed, len(back))
	}
}
