package idem

import (
	"time"

	"github.com/seed094d4201/idem/internal/lifecycle"
)

// A shard keeps its completed entries on expiry runs, so that a sweep, or a
// claim that finds its key expired, touches only what it removes.

// sweepBatch bounds how many entries a sweep removes under one hold of a
// shard's lock, so that claims on that shard never wait behind a long pass.
const sweepBatch = 256

// testHookSweepBatch, if set, runs inside every sweep batch with the shard
// locked. Tests use it to make a sweep panic.
var testHookSweepBatch func()

// Bounds on the cost of placing a completion among the expiry runs: how
// far back from a run's tail it is looked for (two executions that read
// the clock in one order and took the lock in the other), and in how many
// of the newest runs, before it starts a run of its own.
const (
	runWalk   = 8
	runsTried = 8
)

// addToRuns puts the completed entry e in its place on one of sh's newest
// runs, or on a new run when it expires before the recent entries of each
// (the clock stepped back): placing a completion costs at most
// runsTried*runWalk steps, whatever the clock does. A run empties as its
// entries expire, and a sweep drops it. The caller holds sh.mu.
func (sh *shard[R]) addToRuns(e *entry[R]) {
	for i := len(sh.runs) - 1; i >= max(0, len(sh.runs)-runsTried); i-- {
		if sh.runs[i].insert(e, runWalk) {
			return
		}
	}
	run := new(expiryList[R])
	run.insert(e, 0)
	sh.runs = append(sh.runs, run)
}

// sweep removes the entries expired at now, in batches of at most sweepBatch
// per hold of a shard's lock, and returns how many it removed. It stops early
// with stop's error when stop returns one between batches.
func (t *table[R]) sweep(now time.Time, stop func() error) (int, error) {
	total := 0
	for i := range t.shards {
		for {
			if err := stop(); err != nil {
				return total, err
			}
			n := t.sweepBatch(&t.shards[i], now)
			total += n
			if n < sweepBatch {
				break
			}
		}
	}
	return total, nil
}

func (t *table[R]) sweepBatch(sh *shard[R], now time.Time) int {
	sh.mu.Lock()
	defer sh.mu.Unlock() // deferred, so a panic mid-batch cannot leave the shard locked
	if testHookSweepBatch != nil {
		testHookSweepBatch()
	}
	n := 0
	for _, run := range sh.runs {
		for e := run.head; e != nil && n < sweepBatch && !now.Before(e.expires); e = run.head {
			t.move(e, lifecycle.Expire)
			t.drop(sh, e)
			n++
		}
	}
	// Drop the runs emptied, but for the last, which takes the next
	// completions.
	kept := sh.runs[:0]
	for i, run := range sh.runs {
		if run.head != nil || i == len(sh.runs)-1 {
			kept = append(kept, run)
		}
	}
	clear(sh.runs[len(kept):])
	sh.runs = kept
	return n
}

// An expiryList is a run of a shard's completed entries in expiry order,
// so that the expired ones are always a prefix and a sweep touches only
// what it removes. Completions arrive in expiry order but for two cases:
// two executions that read the clock in one order and reach the lock in
// the other (the entry goes a few places back), and a clock stepped back
// (the shard starts a new run). Either way every entry keeps its own
// expiry: a clock step never extends another key's TTL.
type expiryList[R any] struct {
	head, tail *entry[R]
}

// insert puts e, whose expires is set, in its place in l, looking at most
// walk entries back from the tail, and reports whether it found it there.
func (l *expiryList[R]) insert(e *entry[R], walk int) bool {
	p := l.tail
	for ; p != nil && e.expires.Before(p.expires); p = p.prev {
		if walk == 0 {
			return false
		}
		walk--
	}
	// e goes after p (at the head if p is nil).
	e.run, e.prev = l, p
	if p == nil {
		e.next, l.head = l.head, e
	} else {
		e.next, p.next = p.next, e
	}
	if e.next == nil {
		l.tail = e
	} else {
		e.next.prev = e
	}
	return true
}

func (l *expiryList[R]) remove(e *entry[R]) {
	if e.prev == nil {
		l.head = e.next
	} else {
		e.prev.next = e.next
	}
	if e.next == nil {
		l.tail = e.prev
	} else {
		e.next.prev = e.prev
	}
	e.prev, e.next, e.run = nil, nil, nil
}
