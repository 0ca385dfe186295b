package idemtest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
)

// deadClaim leaves key claimed by store 0, killed while its execution ran,
// its lease lapsed, and the model's holds of the kill run out (they last
// settled(), on the real clock: a loaded machine outlives them between two
// calls). It returns the claim as the backend holds it.
func deadClaim(t *testing.T, w *world, key string) backend.Record {
	t.Helper()
	owner := &modelCall{ms: w.stores[0], via: "RunOnce", key: key, payload: "p", p: plan{end: "block"}, timeout: modelCallCtx}
	w.async(owner)
	for !owner.ran() {
		time.Sleep(time.Millisecond)
	}
	w.kill(0, "store killed")
	w.mu.Lock()
	gates := w.gates
	w.gates = nil
	w.mu.Unlock()
	for _, g := range gates {
		g.release("ok") // its outcome's write is refused: the claim stands
	}
	<-w.pending[0].done
	w.pending = nil
	if msg := w.check(owner); msg != "" {
		t.Fatalf("the killed owner's answer: %s\n%s", msg, w.hist.trace())
	}
	w.heal()
	deadline := time.Now().Add(10 * time.Second)
	for {
		rec, ok, err := w.b.Get(context.Background(), key, w.clock.Now())
		if err != nil || !ok {
			t.Fatalf("the dead owner's claim: %v, %v", ok, err)
		}
		if rec.State == backend.StateInterrupted {
			w.mu.Lock()
			clear(w.heldUntil) // settled() has passed
			w.mu.Unlock()
			return rec
		}
		if time.Now().After(deadline) {
			t.Fatalf("the dead owner's lease never lapsed: %+v", rec)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A store takes a lapsed claim for a dead owner's only once it has seen
// it unrenewed for a whole lease within one call (owner.go): a call whose
// ctx is shorter is answered ErrInProgress, however long ago the owner
// died. The model once held the key only for settled() after the death,
// and judged such an answer "ErrInProgress, but nothing held the key" (CI:
// bolt's TestModel, seed 2535708316231076497, under load).
func TestModelDeadOwnersClaimHoldsItsKeyForACallShorterThanALease(t *testing.T) {
	w := dropWorld(t)
	key := w.key(0)
	deadClaim(t, w, key)
	c := &modelCall{ms: w.stores[1], via: "RunOnce", key: key, payload: "p", p: plan{end: "ok"}, timeout: modelCallCtx}
	msg := callNow(w, c)
	if !errors.Is(c.err, idem.ErrInProgress) {
		t.Fatalf("a call shorter than a lease answered %v, not ErrInProgress, for a dead owner's claim\n%s", c.err, w.hist.trace())
	}
	if msg != "" {
		t.Fatalf("ErrInProgress for a dead owner's claim, to a call shorter than a lease, was judged a violation: %s\n%s", msg, w.hist.trace())
	}
	// A patient call judges the owner dead.
	c = &modelCall{ms: w.stores[1], via: "RunOnce", key: key, payload: "p", p: plan{end: "ok"}, timeout: modelSettle}
	if msg := callNow(w, c); msg != "" || !errors.Is(c.err, idem.ErrOutcomeUnknown) {
		t.Fatalf("a call longer than a lease: %v, %q\n%s", c.err, msg, w.hist.trace())
	}
}

// The model holds a key for a dead owner's claim only for a call that
// could not judge it: ErrInProgress is still refused from a call that saw
// the claim for longer than a lease (and the slack), from one that saw a
// live store's claim, and from one whose ctx did not end.
func TestModelRefusesInProgressForAClaimACallCouldJudge(t *testing.T) {
	w := dropWorld(t)
	key := w.key(0)
	dead := deadClaim(t, w, key)
	inProgress := fmt.Errorf("%w: %w", idem.ErrInProgress, context.DeadlineExceeded)
	judged := func(rec backend.Record, seenFor time.Duration, err error) string {
		c := &modelCall{ms: w.stores[1], via: "RunOnce", key: key, payload: "p", timeout: modelSettle}
		w.prepare(c)
		c.deadline = time.Now()
		c.sight = &sighting{rec: rec, first: c.deadline.Add(-seenFor)}
		c.err = err
		return w.check(c)
	}
	if msg := judged(dead, modelLease/2, inProgress); msg != "" {
		t.Fatalf("the allowance itself: %s", msg)
	}
	if msg := judged(dead, modelLease+modelSlack, inProgress); msg == "" {
		t.Fatal("ErrInProgress from a call that saw a dead owner's claim unrenewed for longer than a lease was accepted")
	}
	live := dead
	live.Token = "a live store's"
	w.stores[1].f.won(live.Token)
	if msg := judged(live, modelLease/2, inProgress); msg == "" {
		t.Fatal("ErrInProgress on a live store's claim, nothing running, was accepted")
	}
	if msg := judged(dead, modelLease/2, idem.ErrInProgress); msg == "" {
		t.Fatal("ErrInProgress from a call whose ctx did not end was accepted")
	}
}
