package idemtest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"runtime"
	"runtime/pprof"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"pgregory.net/rapid"
)

// The actions that need a backend: faults, the operator's calls, and
// processes that die, restart or crash.

func isAny(err error, targets ...error) bool {
	for _, t := range targets {
		if errors.Is(err, t) {
			return true
		}
	}
	return false
}

func errorsAs(err error, target any) bool { return errors.As(err, target) }

// actResolve gives a key an outcome, as an operator does.
func (w *world) actResolve(rt *rapid.T) {
	ms, key := w.drawStore(rt), w.drawKey(rt)
	v := -int(w.nextID.Add(1))
	w.mu.Lock()
	if w.resolved[key] == nil {
		w.resolved[key] = map[int]bool{}
	}
	w.resolved[key][v] = true
	w.mu.Unlock()
	disturb0, faulted := w.disturbed.Load(), w.anyFault()
	ctx, cancel := context.WithTimeout(context.Background(), modelCallCtx)
	defer cancel()
	err := w.admin(rt, "Resolve", func() error { return ms.s.Resolve(ctx, key, receipt{N: v}, nil) })
	w.hist.note("resolve %s in store %d with %d -> %v", key, ms.id, v, err)
	if err == nil {
		w.hist.resolved(key, w.clock.Now())
	}
	w.checkAdmin(rt, "Resolve", err, disturb0, faulted, ms)
}

// actRecords lists the records, as an operator's tool does.
func (w *world) actRecords(rt *rapid.T) {
	ms := w.drawStore(rt)
	disturb0, faulted := w.disturbed.Load(), w.anyFault()
	ctx, cancel := context.WithTimeout(context.Background(), modelCallCtx)
	defer cancel()
	n := 0
	err := w.admin(rt, "Records", func() error {
		for _, err := range ms.s.Records(ctx) {
			if err != nil {
				return err
			}
			n++
		}
		return nil
	})
	if err != nil {
		w.hist.note("records in store %d -> %v", ms.id, err)
		w.checkAdmin(rt, "Records", err, disturb0, faulted, ms)
		return
	}
	w.hist.note("records in store %d: %d", ms.id, n)
}

// actFault plans a backend fault for a store: one call that fails, whose
// reply is lost or whose server is silent, or every call of an op until
// healed.
func (w *world) actFault(rt *rapid.T) {
	ms := w.drawStore(rt)
	ms.disturbs.Add(1)
	switch rapid.IntRange(0, 4).Draw(rt, "fault") {
	case 4:
		w.hist.note("store %d: the backend goes silent until healed", ms.id)
		ms.f.goSilent()
		w.holdAll(forever) // nothing lands, but no call can tell
		// Nor do its renewals: its claims' leases lapse, as documented.
		w.unpinStore(ms.id)
		w.renewing = append(w.renewing, w.hist.open(permit{why: "the backend is silent", store: ms.id}))
	case 0:
		w.failNextClaim(ms)
	case 1, 2:
		op := rapid.SampledFrom([]string{"Complete", "Complete", "Complete", "Renew", "Release", "RecordStep"}).Draw(rt, "op")
		w.hist.note("store %d: every %s fails until healed", ms.id, op)
		ms.f.setUntil(op)
		w.holdAll(forever)
		if op == "Renew" {
			w.unpinStore(ms.id)
			// An owner that cannot renew loses its lease: documented.
			w.renewing = append(w.renewing, w.hist.open(permit{why: "renewals fail", store: ms.id}))
		}
	default:
		op := rapid.SampledFrom([]string{"Claim", "Complete", "Release", "Get", "Renew", "Forget", "Resume", "RecordStep"}).Draw(rt, "op")
		k := rapid.SampledFrom([]faultKind{faultFail, faultLose, faultHang}).Draw(rt, "kind")
		w.hist.note("store %d: the next %s: %v", ms.id, op, k)
		ms.f.setOnce(op, k)
		if k == faultLose || op != "Claim" && op != "Get" && op != "Forget" {
			// A write that landed unseen, or failed, is settled in
			// the background.
			w.holdAll(forever)
		}
	}
	w.troubled.Store(true)
	w.disturbAll()
}

// failNextClaim makes the outcome writes of ms's next claim fail until
// healed.
func (w *world) failNextClaim(ms *modelStore) {
	w.hist.note("store %d: the outcome writes of its next claim fail until healed", ms.id)
	ms.f.failNextClaim()
	w.holdAll(forever)
}

// actHeal ends every fault, or only the oldest claim's failing writes.
func (w *world) actHeal(rt *rapid.T) {
	if rapid.Bool().Draw(rt, "one") {
		w.healOldest(w.drawStore(rt))
		return
	}
	w.heal()
}

func (w *world) healOldest(ms *modelStore) {
	if ms.f.healOldest() {
		ms.disturbs.Add(1)
		w.hist.note("store %d: the oldest claim's outcome writes heal", ms.id)
	}
}

func (w *world) heal() {
	w.hist.note("every fault heals")
	for _, ms := range w.stores {
		ms.disturbs.Add(1)
		ms.f.heal()
		ms.u.mu.Lock()
		ms.u.marshal, ms.u.observer = behave, behave
		ms.u.mu.Unlock()
	}
	w.unhold()
	retake := w.opts.RetryInterrupted || w.opts.Resume
	for _, p := range w.renewing {
		w.hist.close(p, retake)
	}
	w.renewing = nil
}

// kill ends store i's process: its backend calls are refused from then
// on, its goroutines left running, and a new process takes its place. A
// key it held may be taken over once its lease lapses, with
// RetryInterrupted or Resume.
func (w *world) kill(i int, why string) {
	old := w.stores[i]
	old.f.kill()
	old.disturbs.Add(1)
	old.killed = true
	w.unpinStore(old.id)
	w.dead = append(w.dead, old)
	w.hist.point(permit{why: why, store: old.id, valid: w.opts.RetryInterrupted || w.opts.Resume, death: true})
	w.disturbAll()
	w.troubled.Store(true)
	w.holdAll(settled())
	w.stores[i] = w.open(w.nextStore())
}

func (w *world) actKill(rt *rapid.T) {
	i := rapid.IntRange(0, len(w.stores)-1).Draw(rt, "store")
	w.hist.note("store %d is killed", w.stores[i].id)
	w.kill(i, "store killed")
}

// actRestart closes a store, as a process shut down cleanly, and opens
// another in its place. Close must return: it waits for executions in
// flight, so blocked ones are let go first.
func (w *world) actRestart(rt *rapid.T) {
	i := rapid.IntRange(0, len(w.stores)-1).Draw(rt, "store")
	ms := w.stores[i]
	w.collect(rt, false)
	w.mu.Lock()
	blocked := len(w.gates) > 0 || len(w.pending) > 0
	w.mu.Unlock()
	if blocked {
		w.hist.note("no restart: executions are blocked or calls in flight")
		return
	}
	w.hist.note("store %d closes", ms.id)
	w.unpinStore(ms.id)
	w.closeStore(rt, ms)
	w.hist.point(permit{why: "store closed", store: ms.id, valid: w.opts.RetryInterrupted || w.opts.Resume, death: true})
	w.troubled.Store(true)
	w.holdAll(settled())
	w.disturbAll()
	w.stores[i] = w.open(w.nextStore())
}

// closeStore closes ms, and fails the sequence if Close does not return.
func (w *world) closeStore(rt *rapid.T, ms *modelStore) {
	ms.closed.Store(true)
	// Close waits for tickets still open; a dropped one is released by
	// its finalizer, once the garbage collector has seen it.
	runtime.GC()
	runtime.GC()
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = ms.s.Close()
	}()
	select {
	case <-done:
	case <-time.After(4*modelSettle + 2*time.Second):
		// What Close waits for is in the stacks: keep them for a failure
		// that CI met and a rerun may not.
		var stacks bytes.Buffer
		_ = pprof.Lookup("goroutine").WriteTo(&stacks, 1)
		rt.Logf("goroutines while store %d's Close hung:\n%s", ms.id, stacks.String())
		w.fail(rt, "store %d's Close did not return", ms.id)
	}
}

// actCrash kills every store, restarts the backend (a real reopen where
// the harness has one) and opens new stores.
func (w *world) actCrash(rt *rapid.T) {
	w.hist.note("crash: every store dies, the backend restarts")
	for i := range w.stores {
		w.kill(i, "crash")
	}
	if w.h.Reopen != nil {
		w.mu.Lock()
		blocked := len(w.gates) > 0
		w.mu.Unlock()
		if !blocked && len(w.pending) == 0 {
			for _, ms := range w.stores {
				_ = ms.s.Close() // the fresh stores, which did nothing yet
			}
			w.b = w.h.Reopen(w.t, w.b)
			setSharedBackend(w.t, w.b)
			for i := range w.stores {
				w.stores[i] = w.open(w.nextStore())
			}
		}
	}
}

func (w *world) nextStore() int {
	w.storeIDs++
	return w.storeIDs
}

// quiesce lets everything settle (faults healed, blocked executions let
// go, calls collected, dead owners' leases lapsed) and checks that no key
// is left in flight: each answers, and the backend's record agrees. With
// last, the stores are closed too, and Close must return.
func (w *world) quiesce(last bool) {
	rt := w.rt
	w.hist.note("quiesce")
	w.heal()
	w.draining.Store(true)
	defer w.draining.Store(false)
	w.mu.Lock()
	gates := w.gates
	w.gates = nil
	w.mu.Unlock()
	for _, g := range gates {
		g.release("ok")
	}
	w.collect(rt, true)
	runtime.GC() // dropped tickets are released by their finalizers
	runtime.GC()
	time.Sleep(modelLease * 3 / 2)
	for i := 0; i < modelKeys; i++ {
		w.probe(rt, w.key(i))
	}
	w.invariant(rt)
	if last {
		for _, ms := range w.stores {
			w.closeStore(rt, ms)
		}
		w.stores = nil
		w.closed(rt)
	}
}

// probe calls key until it answers other than ErrInProgress (a
// background write may still be settling) and judges the answer and the
// backend's record.
func (w *world) probe(rt *rapid.T, key string) {
	ms := w.stores[0]
	caughtUp := false
	deadline := time.Now().Add(3*modelSettle + 2*modelLease)
	for {
		c := &modelCall{ms: ms, via: "RunOnce", key: key, payload: "p", p: plan{end: "ok"}, timeout: modelSettle}
		w.sync(rt, c)
		if c.err == nil || !isAny(c.err, idem.ErrInProgress) {
			break
		}
		w.mu.Lock()
		held := w.heldByLocked(key)
		w.mu.Unlock()
		if held {
			w.hist.note("%s is held until its store closes: its outcome could not be encoded", key)
			break
		}
		if time.Now().After(deadline) {
			if w.clockHeld() && !caughtUp {
				// A lease the clock step lengthened: the clock catches
				// up past it, and the key must then answer.
				w.catchUp()
				caughtUp = true
				deadline = time.Now().Add(3*modelSettle + 2*modelLease)
				continue
			}
			w.fail(rt, "%s is still in flight after every fault healed and every owner finished: %v", key, c.err)
		}
	}
	if w.b == nil {
		return
	}
	rec, ok := w.record(rt, key)
	if ok && rec.State == backend.StateCompleted && !rec.Failed {
		var r receipt
		if err := json.Unmarshal(rec.Value, &r); err != nil {
			w.fail(rt, "%s's record holds %q: %v", key, rec.Value, err)
		}
		oks, _, _ := w.hist.outcomes(key, w.hist.now(), -1)
		w.mu.Lock()
		resolved := w.resolved[key][r.N]
		w.mu.Unlock()
		if !oks[r.N] && !resolved {
			w.fail(rt, "%s's record holds %d, which no execution returned", key, r.N)
		}
	}
}

// catchUp steps the clock past every lease it ever granted: leases
// lapse and outcomes expire, as documented for a clock step forward.
func (w *world) catchUp() {
	d := w.clock.untilAhead(3 * modelLease)
	w.hist.note("the clock catches up: %v", d)
	w.clock.step(d)
	w.unpin("")
	// No reason for a takeover, as for any step (actClock).
	w.hist.point(permit{why: "the clock stepped past every TTL", store: -1, valid: true, completed: true, resets: true, at: w.clock.Now()})
}

// record reads key's record from the backend itself.
func (w *world) record(rt *rapid.T, key string) (backend.Record, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), modelSettle)
	defer cancel()
	rec, ok, err := w.b.Get(ctx, key, w.clock.Now())
	if err != nil {
		w.fail(rt, "reading %s from the backend: %v", key, err)
	}
	return rec, ok
}

// closed checks, once every store is closed and a lease has passed, that
// no claim is still renewed: nothing of a store outlives its Close.
func (w *world) closed(rt *rapid.T) {
	if w.b == nil || w.clockHeld() {
		return
	}
	time.Sleep(modelLease * 3 / 2)
	for i := 0; i < modelKeys; i++ {
		if rec, ok := w.record(rt, w.key(i)); ok && rec.State == backend.StatePending {
			w.fail(rt, "%s is pending with a live lease after every store closed", w.key(i))
		}
	}
}

// end closes whatever the sequence left open: the dead stores, whose
// calls are refused, are closed without judgement.
func (w *world) end() {
	w.mu.Lock()
	for _, g := range w.gates {
		g.release("ok")
	}
	w.gates = nil
	w.mu.Unlock()
	for _, ms := range append(w.stores, w.dead...) {
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = ms.s.Close()
		}()
		select {
		case <-done:
		case <-time.After(4 * modelSettle):
		}
	}
}
