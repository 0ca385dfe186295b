package idemtest

import (
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
)

// A call that waits on another call's claim in its store answers the error
// that claim ends with (DESIGN.md, rule 2: every waiter gets it), a
// backend error too. The model once judged such an answer "a backend error
// with no fault" when the fault had been taken by the other call's claim
// before the waiter started, so that none was planned any more (CI,
// TestModelMemoryBackend, seed 131323991486042211, only under load: the
// duplicate's goroutine sent its claim after the fault was planned).

// planClaimHang plans, as actFault does, that the next Claim of ms waits
// for its ctx, then fails unsent.
func planClaimHang(w *world, ms *modelStore) {
	ms.disturbs.Add(1)
	ms.f.setOnce("Claim", faultHang)
	w.troubled.Store(true)
	w.disturbAll()
}

// waitTaken waits until a call has taken the Claim fault planned for ms.
func waitTaken(t *testing.T, ms *modelStore) {
	deadline := time.Now().Add(10 * time.Second)
	for ms.f.active() {
		if time.Now().After(deadline) {
			t.Fatal("the owner never sent its claim")
		}
		runtime.Gosched()
	}
}

// waiterSharesTheOwnersFault runs the owner (started by start), then a
// waiter of the same key in the same store once the owner's claim has
// taken the fault, and checks that both answers are accepted.
func waiterSharesTheOwnersFault(t *testing.T, w *world, start func(owner *modelCall)) {
	ms, key := w.stores[0], w.key(0)
	owner := &modelCall{ms: ms, via: "RunOnce", key: key, payload: "p", p: plan{end: "ok"}, timeout: 1500 * time.Millisecond}
	start(owner)
	waitTaken(t, ms)
	// The owner's claim hangs until its ctx ends: the waiter, whose ctx
	// is longer, waits on it and hears how it ended.
	waiter := &modelCall{ms: ms, via: "RunOnce", key: key, payload: "p", p: plan{end: "ok"}, timeout: 3 * time.Second}
	msg := callNow(w, waiter)
	var be *idem.BackendError
	if !errors.As(waiter.err, &be) || waiter.ran() {
		t.Fatalf("the waiter answered %v (ran %v), not its owner's claim's backend error\n%s", waiter.err, waiter.ran(), w.hist.trace())
	}
	if msg != "" {
		t.Fatalf("the waiter's answer, its owner's claim's error, was judged a violation: %s\n%s", msg, w.hist.trace())
	}
	<-w.pending[0].done
	w.pending = nil
	if msg := w.check(owner); msg != "" {
		t.Fatalf("the owner's answer: %s\n%s", msg, w.hist.trace())
	}
}

// The fault is planned, then the owner starts and its claim takes it.
func TestModelWaiterSharesAFaultItsOwnerTookFirst(t *testing.T) {
	w := dropWorld(t)
	planClaimHang(w, w.stores[0])
	waiterSharesTheOwnersFault(t, w, w.async)
}

// The owner starts, then the fault is planned, and only then does the
// owner's goroutine send its claim (a loaded machine).
func TestModelWaiterSharesAFaultPlannedAfterItsOwnerStarted(t *testing.T) {
	w := dropWorld(t)
	waiterSharesTheOwnersFault(t, w, func(owner *modelCall) {
		w.prepare(owner)
		planClaimHang(w, w.stores[0])
		w.launch(owner)
	})
}

// What a waiter may share is its own key's claim in its own store, and
// only when it ran no fn of its own: a backend error is still refused for
// a call whose store met no fault, beside faulted calls of another store
// or of another key, and for a call that owned its key.
func TestModelRefusesABackendErrorNoCallOfItsKeyAndStoreMet(t *testing.T) {
	w := dropWorld(t)
	key := w.key(0)
	inFlight := func(ms *modelStore, key string) {
		w.pending = append(w.pending, &asyncCall{c: &modelCall{ms: ms, via: "RunOnce", key: key, payload: "p", faulted: true}, done: make(chan struct{})})
	}
	inFlight(w.stores[1], key)      // another store's call of the key
	inFlight(w.stores[0], w.key(1)) // another key's call in the store
	c := &modelCall{ms: w.stores[0], via: "RunOnce", key: key, payload: "p", timeout: modelCallCtx}
	w.prepare(c)
	c.err = &idem.BackendError{Op: "claim", Err: errInjected}
	if msg := w.check(c); msg == "" {
		t.Fatal("a backend error in a store no fault met was accepted")
	}

	inFlight(w.stores[0], key) // a faulted call of the key in the store
	owner := &modelCall{ms: w.stores[0], via: "RunOnce", key: key, payload: "p", timeout: modelCallCtx}
	w.prepare(owner)
	owner.exec.Store(&execEvent{id: 1, key: key})
	owner.err = &idem.BackendError{Op: "complete", Err: errInjected}
	if msg := w.check(owner); msg == "" {
		t.Fatal("a backend error of a call that ran its own fn, in a store no fault met, was accepted")
	}
	w.pending = nil
}
