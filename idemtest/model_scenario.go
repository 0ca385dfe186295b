package idemtest

import (
	"context"
	"time"

	"pgregory.net/rapid"
)

// Scenarios are actions made of actions: an order of rare events that a
// random sequence would meet too seldom to find what lives where they
// meet. Each step of a scenario is judged as the same step drawn alone
// would be, and the sequence goes on at random after it.

// actDrop is the operator who deletes a key's claim in the backend by
// hand (a manual DELETE: what issue reports call the last resort for a
// stuck key). Nothing in any store hears of it: an owner finds its claim
// gone at its next write. The key may run again at once, in any store;
// what a store holds in memory it may still replay.
func (w *world) actDrop(rt *rapid.T) {
	w.drop(w.drawKey(rt))
}

func (w *world) drop(key string) {
	ctx, cancel := context.WithTimeout(context.Background(), modelCallCtx)
	defer cancel()
	rec, ok, err := w.b.Get(ctx, key, w.clock.Now())
	if err != nil || !ok {
		w.hist.note("the operator finds no record of %s to delete (%v)", key, err)
		return
	}
	p := w.hist.open(permit{why: "the operator deletes the claim of " + key, key: key, store: -1, resets: true, by: -2})
	err = w.b.Release(ctx, key, rec.Token)
	w.hist.close(p, err == nil)
	w.hist.note("the operator deletes %s's %s claim %.8s -> %v", key, rec.State, rec.Token, err)
	if err == nil {
		// A store that holds the key's outcome unrecorded finds its claim
		// gone at its next renewal, and stops replaying it.
		w.unpin(key)
		w.disturb(key)
		w.troubled.Store(true)
		w.hold(key, settled())
	}
}

// actReconcilePinned is the operator's reconciliation of an outcome a
// store holds unrecorded, while that store goes on trying to record it:
// a store's claim has its outcome writes failing; its execution succeeds
// and is held, pinned, in memory; the operator deletes the claim in the
// backend and forgets the key in that store; a second execution there is
// held behind a second failing claim; then the first claim's writes heal,
// so that its background write finds the key in other hands; then the
// key is called there again. (Issue 18: that stale write unpinned the
// second execution's outcome, and the key ran a third time.)
func (w *world) actReconcilePinned(rt *rapid.T) {
	ms, key := w.drawStore(rt), w.drawKey(rt)
	w.hist.note("scenario: reconcile %s while store %d holds it unrecorded", key, ms.id)
	run := func() {
		w.sync(rt, &modelCall{ms: ms, via: "RunOnce", key: key, payload: "p", p: plan{end: "ok"}, timeout: modelCallCtx})
	}
	w.forget(rt, ms, key) // a key that completed before would only replay
	w.failNextClaim(ms)
	run()
	// A call answers before its write goes on in the background when
	// its ctx is shorter than the store's settle: the write must be
	// there before the operator is.
	time.Sleep(w.opts.SettleTimeout)
	w.drop(key)
	w.forget(rt, ms, key)
	w.failNextClaim(ms)
	run()
	w.healOldest(ms)
	w.actSleep(rt)
	run()
}
