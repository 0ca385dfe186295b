package idem

import (
	"fmt"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/seed094d4201/idem/internal/lifecycle"
)

// numShards splits the claim table so that goroutines working on different
// keys rarely contend for one mutex. A power of two, so a hash picks a shard
// with a mask.
const numShards = 32

// testHookMove, if set, hears every move of an entry, with the shard
// locked. Tests use it to see the lifecycle's transitions made.
// Atomic: a store left running by an earlier test may move entries while
// a test sets it.
var testHookMove atomic.Pointer[func(key string, from lifecycle.Phase, ev lifecycle.Event, m lifecycle.Move)]

// claimKind says what a claim found.
type claimKind int

const (
	claimOwner   claimKind = iota // the key was absent: the caller must execute and settle
	claimWait                     // in flight: wait on entry.done
	claimReplay                   // completed: entry.val and entry.err are the outcome
	claimRecheck                  // in flight with another payload, unconfirmed: wait on entry.done or entry.checked, then claim again
)

// A table is the claim table: every key's entry, split across shards. Its
// methods are the only code that changes an entry's state, each through
// move, which makes the transition internal/lifecycle's table names.
type table[R any] struct {
	seed    maphash.Seed
	maxKeys int64          // 0: unbounded
	keys    atomic.Int64   // entries held, maintained only when maxKeys > 0
	running sync.WaitGroup // executions in flight; Add only under a shard lock while the shard is open
	shards  [numShards]shard[R]
}

type shard[R any] struct {
	mu      sync.Mutex
	closed  bool                 // guarded by mu; no claims once set
	entries map[string]*entry[R] // guarded by mu
	marks   int                  // how many of entries are reconcile's marks, not keys; guarded by mu
	// runs holds the completed entries, each run in expiry order; one
	// unless the clock stepped back, each step back within a TTL adding
	// one. Guarded by mu.
	runs []*expiryList[R]
	_    [64]byte // keep neighbouring shards' locks off one cache line
}

func newTable[R any](maxKeys int) *table[R] {
	t := &table[R]{seed: maphash.MakeSeed(), maxKeys: int64(maxKeys)}
	for i := range t.shards {
		t.shards[i].entries = make(map[string]*entry[R])
	}
	return t
}

func (t *table[R]) shard(key string) *shard[R] {
	return &t.shards[maphash.String(t.seed, key)&(numShards-1)]
}

// claim atomically looks key up and, if it is absent or expired, inserts a
// new in-flight entry owned by the caller, counting it as running. Lookup and
// insert happen under one lock with nothing blocking in between. If the key
// is in flight and wantDone is set, claim makes sure the entry has a done
// channel to wait on; the owner asks for one when it may stop waiting before
// the execution ends.
//
// With unconfirmed set, a new entry's payload is not yet the key's: its
// claim is on its way to a Backend, which may hold the key for another
// payload. A caller with another payload then waits for it and claims
// again (claimRecheck) rather than be refused by a payload that may never
// hold the key; once confirm(e), it is refused at once.
func (t *table[R]) claim(key string, fp Fingerprint, now time.Time, wantDone, unconfirmed bool) (*entry[R], claimKind, error) {
	sh := t.shard(key)
	sh.mu.Lock()
	e, kind, err := t.claimLocked(sh, key, fp, now, wantDone, unconfirmed)
	sh.mu.Unlock() // not deferred: a replay's every nanosecond counts, and nothing under the lock panics
	return e, kind, err
}

// claimLocked is claim with sh, key's shard, locked.
func (t *table[R]) claimLocked(sh *shard[R], key string, fp Fingerprint, now time.Time, wantDone, unconfirmed bool) (*entry[R], claimKind, error) {
	if sh.closed {
		return nil, 0, ErrClosed
	}
	if e := sh.entries[key]; e != nil {
		if e.phase == lifecycle.Completed && !now.Before(e.expires) {
			t.move(e, lifecycle.Expire)
			t.drop(sh, e) // the key is free again
		} else {
			ev := lifecycle.Call
			if e.fp != fp {
				ev = lifecycle.CallOther
			}
			switch a := t.move(e, ev); a {
			case lifecycle.Mismatch:
				return nil, 0, ErrPayloadMismatch
			case lifecycle.Replay:
				return e, claimReplay, nil
			case lifecycle.Wait, lifecycle.Recheck:
				if e.done == nil {
					e.done = make(chan struct{})
				}
				if a == lifecycle.Wait {
					return e, claimWait, nil
				}
				if e.checked == nil {
					e.checked = make(chan struct{})
				}
				return e, claimRecheck, nil
			default:
				return nil, 0, strayMove(e.phase, ev)
			}
		}
	}
	if t.maxKeys > 0 && !t.reserve() {
		return nil, 0, ErrFull
	}
	e := &entry[R]{key: key, fp: fp, shard: sh}
	ev := lifecycle.Claim
	if unconfirmed {
		ev = lifecycle.ClaimDurable
	}
	if t.move(e, ev) != lifecycle.Own {
		if t.maxKeys > 0 {
			t.keys.Add(-1)
		}
		return nil, 0, strayMove(lifecycle.Absent, ev)
	}
	if wantDone {
		e.done = make(chan struct{})
	}
	sh.entries[key] = e
	t.running.Add(1)
	return e, claimOwner, nil
}

// move makes the transition ev makes from e's phase and returns what the
// caller is told; a move the lifecycle lacks changes nothing. It is the
// only writer of an entry's phase. The caller holds e.shard.mu.
func (t *table[R]) move(e *entry[R], ev lifecycle.Event) lifecycle.Answer {
	from := e.phase
	m := lifecycle.Next(from, ev)
	if m.Answer != lifecycle.Invalid && m.To != from {
		// Written only on a change: a replay reads its entry alone, so
		// that callers replaying one key on many cores share its line.
		e.phase = m.To
	}
	if hear := testHookMove.Load(); hear != nil {
		(*hear)(e.key, from, ev, m)
	}
	return m.Answer
}

// strayMove is the error a call gets when the lifecycle has no move for
// it: a defect in this package, which lifecycle.Strays counts.
func strayMove(p lifecycle.Phase, ev lifecycle.Event) error {
	return fmt.Errorf("idem: internal error: the key's lifecycle has no move for %v on %v", ev, p)
}

// confirm marks e's payload as the key's: its claim landed.
func (t *table[R]) confirm(e *entry[R]) {
	sh := e.shard
	sh.mu.Lock()
	if t.move(e, lifecycle.Confirm) == lifecycle.Done && e.checked != nil {
		close(e.checked) // the callers with another payload are refused now
	}
	sh.mu.Unlock()
}

// reserve counts one more key unless that would pass maxKeys. It never
// overshoots, even for a moment, so a concurrent claim is never refused
// while a slot is free.
func (t *table[R]) reserve() bool {
	for {
		n := t.keys.Load()
		if n >= t.maxKeys {
			return false
		}
		if t.keys.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// complete records e's outcome, already written to e.val and e.err, as final
// until expires, and wakes its waiters.
func (t *table[R]) complete(e *entry[R], expires time.Time) {
	sh := e.shard
	sh.mu.Lock()
	if t.move(e, lifecycle.Complete) == lifecycle.Done {
		e.expires = expires
		sh.addToRuns(e)
	}
	if e.done != nil {
		close(e.done)
	}
	sh.mu.Unlock()
	t.running.Done()
}

// pin records e's outcome, already in e.val and e.err, until unpin: it
// never expires and no sweep removes it. It is for an outcome the Backend
// could not record, whose key must not run again here meanwhile.
func (t *table[R]) pin(e *entry[R]) {
	sh := e.shard
	sh.mu.Lock()
	t.move(e, lifecycle.Pin)
	if e.done != nil {
		close(e.done)
	}
	sh.mu.Unlock()
	t.running.Done()
}

// unpin removes e, a pinned entry whose outcome the backend has now
// settled, so that later calls read the backend. It reports false while
// e's execution has yet to pin it. An entry that is no longer its key's
// (released while its outcome was recorded in the background, and the
// key perhaps claimed again since) is left alone: its key's entry is
// another owner's.
func (t *table[R]) unpin(e *entry[R]) bool {
	sh := e.shard
	sh.mu.Lock()
	defer sh.mu.Unlock()
	from := e.phase
	switch t.move(e, lifecycle.Unpin) {
	case lifecycle.NotYet:
		return false
	case lifecycle.Done:
		if from != lifecycle.Absent {
			t.drop(sh, e)
		}
	}
	return true
}

// release removes e, whose execution failed before commit, so the next call
// with its key executes again, and wakes its waiters with e.err.
func (t *table[R]) release(e *entry[R]) {
	sh := e.shard
	sh.mu.Lock()
	if t.move(e, lifecycle.Release) == lifecycle.Done {
		t.drop(sh, e)
	}
	if e.done != nil {
		close(e.done)
	}
	sh.mu.Unlock()
	t.running.Done()
}

// owns reports whether e is still its key's entry in flight: nobody has
// settled it.
func (t *table[R]) owns(e *entry[R]) bool {
	sh := e.shard
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return e.phase.InFlight()
}

// inFlight reports whether key has an execution in flight in this table.
func (t *table[R]) inFlight(key string) bool {
	sh := t.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.entries[key]
	return e != nil && e.phase.InFlight()
}

// reconcile holds key in memory for an operator's Forget or Resolve
// with a Backend, and returns the mark that holds it: until reconciled
// ends it, a call of the key here waits, then claims again, so that no
// claim of the key starts here while the operator changes its record in
// the Backend. A key in flight here, whose outcome this store is still
// recording (pinned), or that another operator's call holds, is refused
// with ErrKeyHeld. The mark counts against no MaxKeys: an operator can
// reconcile a key of a full store.
func (t *table[R]) reconcile(key string) (*entry[R], error) {
	sh := t.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.closed {
		return nil, ErrClosed
	}
	e := sh.entries[key]
	if e == nil {
		m := &entry[R]{key: key, shard: sh}
		if a := t.move(m, lifecycle.Reconcile); a != lifecycle.Own {
			return nil, strayMove(lifecycle.Absent, lifecycle.Reconcile)
		}
		sh.entries[key] = m
		sh.marks++
		return m, nil
	}
	switch from := e.phase; t.move(e, lifecycle.Reconcile) {
	case lifecycle.Held:
		why := "is in flight in this store"
		switch from {
		case lifecycle.Pinned:
			why = "has an outcome this store is still recording"
		case lifecycle.Reconciling:
			why = "is being forgotten or resolved by another call"
		}
		return nil, fmt.Errorf("%w: key %q %s", ErrKeyHeld, key, why)
	default:
		return nil, strayMove(from, lifecycle.Reconcile)
	}
}

// reconciled ends m, reconcile's mark: the key is absent here again, and
// the calls that waited for it claim again.
func (t *table[R]) reconciled(m *entry[R]) {
	sh := m.shard
	sh.mu.Lock()
	if t.move(m, lifecycle.Reconciled) == lifecycle.Done {
		delete(sh.entries, m.key) // on no run, and counted in no MaxKeys
		sh.marks--
	}
	if m.done != nil {
		close(m.done)
	}
	sh.mu.Unlock()
}

// forget removes key's completed entry, in a store without a Backend. A
// key in flight is refused with ErrKeyHeld; an absent key is not an
// error.
func (t *table[R]) forget(key string) error {
	sh := t.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.entries[key]
	switch {
	case sh.closed:
		return ErrClosed
	case e == nil:
		return nil
	}
	switch ev := lifecycle.Forget; t.move(e, ev) {
	case lifecycle.Held:
		return ErrKeyHeld
	case lifecycle.Done:
		t.drop(sh, e)
		return nil
	default:
		return strayMove(e.phase, ev)
	}
}

// drop removes e, which has just moved to Absent, from sh. The caller
// holds sh.mu.
func (t *table[R]) drop(sh *shard[R], e *entry[R]) {
	if e.run != nil { // pinned entries are on no run
		e.run.remove(e)
	}
	delete(sh.entries, e.key)
	if t.maxKeys > 0 {
		t.keys.Add(-1)
	}
}

// len returns the number of entries held, in flight or completed.
func (t *table[R]) len() int {
	n := 0
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		n += len(sh.entries) - sh.marks
		sh.mu.Unlock()
	}
	return n
}

// held counts the entries in flight, and those pinned (an outcome held
// until the Backend takes it).
func (t *table[R]) held() (inFlight, pinned int) {
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		for _, e := range sh.entries {
			switch {
			case e.phase.InFlight():
				inFlight++
			case e.phase == lifecycle.Pinned:
				pinned++
			}
		}
		sh.mu.Unlock()
	}
	return inFlight, pinned
}

// close refuses every later claim. After it returns, running only goes down.
func (t *table[R]) close() {
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		sh.closed = true
		sh.mu.Unlock()
	}
}
