package idemtest

import (
	"fmt"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
)

func dropWorld(t *testing.T) *world {
	w := emptyWorld(t, fmt.Sprintf("drop-%d", sequences.Add(1)))
	w.b = NewMemoryBackend()
	w.opts = idem.Options{TTL: modelTTL, Lease: modelLease, SettleTimeout: modelCallCtx * 3 / 4, SweepInterval: -1, Now: w.clock.Now}
	w.stores = []*modelStore{w.open(0), w.open(1)}
	w.storeIDs = 1
	t.Cleanup(w.end)
	return w
}

func callNow(w *world, c *modelCall) string {
	w.hist.note("call %v", c)
	w.prepare(c)
	w.do(c)
	w.hist.note("  -> %v, %v (ran %v)", c.val, c.err, c.ran())
	return w.check(c)
}

// Regression tests for the model's drop action: each is a correct answer
// the model once judged a violation.

// A drop of a claim whose outcome store 0 holds pinned: the store's
// background write finds no record, unpins, and the next call runs the
// key afresh (rightly: the operator deleted the claim). The model's pin
// once survived the drop.
func TestModelDropEndsAPin(t *testing.T) {
	w := dropWorld(t)
	ms, key := w.stores[0], w.key(0)
	w.failNextClaim(ms)
	if msg := callNow(w, &modelCall{ms: ms, via: "RunOnce", key: key, payload: "p", p: plan{end: "ok"}, timeout: modelCallCtx}); msg != "" {
		t.Fatalf("first call: %s", msg)
	}
	if _, ok := w.pinOf(key); !ok {
		t.Fatalf("expected a pin\n%s", w.hist.trace())
	}
	time.Sleep(w.opts.SettleTimeout)
	w.drop(key)
	time.Sleep(2 * time.Second) // the background write's next tries find the claim gone, and unpin
	msg := callNow(w, &modelCall{ms: ms, via: "RunOnce", key: key, payload: "p", p: plan{end: "ok"}, timeout: modelCallCtx})
	if v := w.hist.judge(); len(v) > 0 {
		t.Logf("judge: %v", v)
	}
	if msg != "" {
		t.Fatalf("a correct answer judged a violation: %s\n%s", msg, w.hist.trace())
	}
}

// Begin/finish whose claim is dropped while Finish settles a failing
// write: Finish returns a *NotRecordedError wrapping ErrNotOwner and the
// store pins nothing; the model once pinned it anyway (an operator
// precedence slip in check).
func TestModelLostClaimInFinishPinsNothing(t *testing.T) {
	w := dropWorld(t)
	w.opts.SettleTimeout = 2 * time.Second
	w.stores = []*modelStore{w.open(0), w.open(1)}
	ms, key := w.stores[0], w.key(0)
	w.failNextClaim(ms)
	c := &modelCall{ms: ms, via: "Begin/finish", key: key, payload: "p", p: plan{end: "ok"}, timeout: modelCallCtx}
	w.async(c)
	for !c.ran() || w.hist.running(key) { // then Finish settles its failing Complete, for 2 s
		time.Sleep(time.Millisecond)
	}
	w.drop(key)
	<-w.pending[0].done
	w.pending = nil
	w.hist.note("collected %v -> %v, %v", c, c.val, c.err)
	if msg := w.check(c); msg != "" {
		t.Fatalf("first call: %s", msg)
	}
	_, pinned := w.pinOf(key)
	t.Logf("err %v; model pinned: %v", c.err, pinned)
	msg := callNow(w, &modelCall{ms: ms, via: "RunOnce", key: key, payload: "p", p: plan{end: "ok"}, timeout: modelCallCtx})
	if msg != "" {
		t.Fatalf("a correct answer judged a violation: %s\n%s", msg, w.hist.trace())
	}
}

// A store whose renewals fail (since before the call) pins an outcome it
// could not record: its lease lapses, and a store with RetryInterrupted
// rightly takes the interrupted key and runs it again; the first store,
// once its write finds the claim in other hands, answers the backend's
// outcome. The model once held it to its pin (found by TestModel on
// postgres, seed 14398030134447440239, shrunk to this).
func TestModelPinWithoutRenewalsBindsNothing(t *testing.T) {
	w := dropWorld(t)
	w.opts.RetryInterrupted = true
	w.stores = []*modelStore{w.open(0), w.open(1)}
	ms, other, key := w.stores[0], w.stores[1], w.key(0)
	ms.f.setUntil("Renew")
	w.failNextClaim(ms)
	run := func(ms *modelStore) string {
		return callNow(w, &modelCall{ms: ms, via: "RunOnce", key: key, payload: "p", p: plan{end: "ok"}, timeout: modelCallCtx})
	}
	if msg := run(ms); msg != "" {
		t.Fatalf("first call: %s\n%s", msg, w.hist.trace())
	}
	time.Sleep(modelLease * 3 / 2) // the lease lapses: no renewal gets through
	if msg := run(other); msg != "" {
		t.Fatalf("the other store: %s\n%s", msg, w.hist.trace())
	}
	w.heal()
	time.Sleep(2 * time.Second) // the background write finds the claim in other hands
	if msg := run(ms); msg != "" {
		t.Fatalf("a correct answer judged a violation: %s\n%s", msg, w.hist.trace())
	}
}
