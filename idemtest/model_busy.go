package idemtest

import (
	"errors"
	"math"
	"strings"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
)

// When may a key answer ErrInProgress? Only while something may hold it:
// an execution or a call of it in flight, an outcome this process holds
// unrecorded, a ticket dropped and not yet collected, a claim of a dead
// store whose lease has not lapsed, a write that failed and is being
// settled. A key that nothing holds is claimed, replayed or refused, never
// waited on: an answer of ErrInProgress then is a key stuck in flight,
// or a backend failure misreported.

// forever is a hold that only a heal or a quiescence ends.
var forever = time.Unix(0, math.MaxInt64)

// holdAll marks every key as possibly held until until.
func (w *world) holdAll(until time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i := 0; i < modelKeys; i++ {
		w.holdLocked(w.key(i), until)
	}
}

func (w *world) hold(key string, until time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.holdLocked(key, until)
}

func (w *world) holdLocked(key string, until time.Time) {
	if until.After(w.heldUntil[key]) {
		w.heldUntil[key] = until
	}
}

// settled is how long after a fault heals, or a store dies, a key may
// still be held: its writes settled, its lease lapsed.
func settled() time.Time { return time.Now().Add(modelSettle + 3*modelLease) }

// unhold ends the holds that a heal ends: they last settled() more.
func (w *world) unhold() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for k, until := range w.heldUntil {
		if until == forever {
			w.heldUntil[k] = settled()
		}
	}
}

// busy reports whether something may hold key now.
func (w *world) busy(key string) bool {
	if w.hist.running(key) || w.clockHeld() {
		return true
	}
	for _, a := range w.pending {
		if a.c.key == key {
			return true
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, g := range w.gates {
		if g.key == key {
			return true
		}
	}
	return time.Now().Before(w.heldUntil[key]) || w.heldByLocked(key)
}

// heldByLocked reports whether a live store holds key's outcome, which it
// could not encode, until it closes.
func (w *world) heldByLocked(key string) bool {
	ms := w.heldBy[key]
	return ms != nil && !ms.killed && !ms.closed.Load()
}

// A pin is an outcome a store holds in memory unrecorded: it replays it to
// every call of the key, and neither runs the key again nor waits, until
// the outcome is recorded, the key is forgotten, or the claim may have
// been lost (its lease lapsed by a clock step or a renew outage).
type pin struct {
	store   int
	value   int
	payload string
}

func (w *world) pinOf(key string) (pin, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	p, ok := w.pins[key]
	return p, ok
}

// unpin forgets the pins of key, or of every key for "".
func (w *world) unpin(key string) {
	w.unpins.Add(1)
	w.mu.Lock()
	defer w.mu.Unlock()
	if key == "" {
		clear(w.pins)
		return
	}
	delete(w.pins, key)
}

// unpinStore forgets the pins a store held.
func (w *world) unpinStore(id int) {
	w.unpins.Add(1)
	w.mu.Lock()
	defer w.mu.Unlock()
	for k, p := range w.pins {
		if p.store == id {
			delete(w.pins, k)
		}
	}
}

// heardUnrecorded holds the key of an outcome its store was told it could
// not record, as soon as it is told: the call that owned it may have been
// answered long before (a RunOnce whose caller left while its execution
// went on), and its answer's check is then past. An outcome that could not
// be written at all (the Codec, or the user's code ending the goroutine
// that recorded it) is held, its lease renewed, until its store closes
// (documented: finishExited, holdLease); any other is held until the
// backend takes it, after a heal, unless the claim was lost to another
// owner.
func (w *world) heardUnrecorded(c *modelCall, nr *idem.NotRecordedError) {
	switch why := nr.Err.Error(); {
	case strings.Contains(why, "Codec") || strings.Contains(why, "Goexit"):
		w.mu.Lock()
		w.heldBy[c.key] = c.ms
		w.mu.Unlock()
	case errors.Is(nr.Err, backend.ErrNotOwner):
		w.hold(c.key, settled())
	default:
		w.hold(c.key, forever)
	}
}
