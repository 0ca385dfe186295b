package idemtest

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/internal/lifecycle"
	"pgregory.net/rapid"
)

// modelKeys is how many keys a sequence uses: few, so that its calls meet.
const modelKeys = 2

// An action is one thing the driver can do, drawn with its weight: the
// rare modes are drawn often enough to meet each other in a sequence of
// thirty.
type action struct {
	name   string
	weight int
	do     func(*rapid.T)
}

func (w *world) table() []action {
	t := []action{
		{"run", 10, w.actRun},
		{"begin", 5, w.actBegin},
		{"duplicate", 4, w.actDuplicate},
		{"mismatch", 2, w.actMismatch},
		{"unblock", 4, w.actUnblock},
		{"collect", 3, w.actCollect},
		{"forget", 3, w.actForget},
		{"sweep", 1, w.actSweep},
		{"clock", 3, w.actClock},
		{"sleep", 4, w.actSleep},
		{"misbehave", 2, w.actMisbehave},
		{"quiesce", 1, func(*rapid.T) { w.quiesce(false) }},
	}
	if w.b != nil {
		t = append(t, []action{
			{"resolve", 2, w.actResolve},
			{"records", 1, w.actRecords},
			{"fault", 6, w.actFault},
			{"heal", 3, w.actHeal},
			{"kill", 2, w.actKill},
			{"restart", 1, w.actRestart},
			{"crash", 1, w.actCrash},
			{"drop", 1, w.actDrop},
			{"reconcile pinned", 1, w.actReconcilePinned},
			{"step past a live owner", 3, w.actStepPastLiveOwner},
		}...)
	}
	return t
}

// actions returns the state machine's actions for rapid: "" is the
// invariant it checks after each; "act" draws one of the table's by
// weight.
func (w *world) actions() map[string]func(*rapid.T) {
	var names []string
	do := map[string]func(*rapid.T){}
	for _, a := range w.table() {
		do[a.name] = a.do
		for i := 0; i < a.weight; i++ {
			names = append(names, a.name)
		}
	}
	return map[string]func(*rapid.T){
		"": w.invariant,
		"act": func(rt *rapid.T) {
			do[rapid.SampledFrom(names).Draw(rt, "action")](rt)
		},
	}
}

// invariant fails the sequence on any violation of the history.
func (w *world) invariant(rt *rapid.T) {
	if v := w.hist.judge(); len(v) > 0 {
		w.failing.Store(true)
		rt.Fatalf("%s\n\nhistory:\n%s", v[0], w.hist.trace())
	}
	if n, last := lifecycle.Strays(); n > w.strays {
		w.fail(rt, "a store made %d moves its key lifecycle (internal/lifecycle) lacks, the last %s", n-w.strays, last)
	}
}

func (w *world) fail(rt *rapid.T, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	w.failing.Store(true)
	w.hist.note("VIOLATION: %s", msg)
	rt.Fatalf("%s\n\nhistory:\n%s", msg, w.hist.trace())
}

func (w *world) drawStore(rt *rapid.T) *modelStore {
	return w.stores[rapid.IntRange(0, len(w.stores)-1).Draw(rt, "store")]
}

// drawKey draws a key, the first twice as often as the second: most
// actions meet on one key, some on two.
func (w *world) drawKey(rt *rapid.T) string {
	return w.key(rapid.SampledFrom([]int{0, 0, 1}).Draw(rt, "key"))
}

// drawPlan draws what an execution does. A blocked execution waits for
// the driver; at most three wait at once.
func (w *world) drawPlan(rt *rapid.T) plan {
	ends := []string{"ok", "ok", "ok", "fail", "final", "panic", "goexit", "block"}
	var p plan
	if rapid.IntRange(0, 2).Draw(rt, "stepped") == 0 {
		n := rapid.IntRange(1, 3).Draw(rt, "steps")
		for i := 0; i < n; i++ {
			p.steps = append(p.steps, rapid.SampledFrom([]string{"ok", "ok", "fail", "panic", "block"}).Draw(rt, "step"))
		}
	}
	p.end = rapid.SampledFrom(ends).Draw(rt, "end")
	w.mu.Lock()
	full := len(w.gates) >= 3
	w.mu.Unlock()
	if full {
		for i, s := range p.steps {
			if s == "block" {
				p.steps[i] = "ok"
			}
		}
		if p.end == "block" {
			p.end = "ok"
		}
	}
	return p
}

func (p plan) blocks() bool {
	for _, s := range p.steps {
		if s == "block" {
			return true
		}
	}
	return p.end == "block"
}

// sync makes the call c and judges its answer.
func (w *world) sync(rt *rapid.T, c *modelCall) {
	w.hist.note("call %v", c)
	w.prepare(c)
	done := make(chan struct{})
	go func() { // the user's code inside the store may end the goroutine
		defer close(done)
		w.do(c)
	}()
	select {
	case <-done:
	case <-time.After(c.timeout + 4*modelSettle):
		w.fail(rt, "%v never returned", c)
	}
	w.hist.note("  -> %v, %v (ran %v, took %v)", c.val, c.err, c.ran(), c.took.Round(time.Millisecond))
	if c.via == "Begin/drop" && !w.anyFault() {
		runtime.GC() // its finalizer releases the dropped ticket's key
		w.mu.Lock()
		w.heldUntil[c.key] = settled()
		w.mu.Unlock()
	}
	if msg := w.check(c); msg != "" {
		w.fail(rt, "%v: %s", c, msg)
	}
}

func (w *world) actRun(rt *rapid.T) {
	w.sync(rt, &modelCall{ms: w.drawStore(rt), via: "RunOnce", key: w.drawKey(rt), payload: "p", p: w.drawPlan(rt), timeout: modelCallCtx})
}

func (w *world) actMismatch(rt *rapid.T) {
	w.sync(rt, &modelCall{ms: w.drawStore(rt), via: "RunOnce", key: w.drawKey(rt), payload: "q", p: w.drawPlan(rt), timeout: modelCallCtx})
}

// actBegin makes a call through Begin, ending the ticket with Finish,
// Release or not at all; a call whose work blocks goes on a goroutine.
func (w *world) actBegin(rt *rapid.T) {
	end := rapid.SampledFrom([]string{"finish", "finish", "release", "drop"}).Draw(rt, "ticket")
	c := &modelCall{ms: w.drawStore(rt), via: "Begin/" + end, key: w.drawKey(rt), payload: "p", p: w.drawPlan(rt), timeout: modelCallCtx}
	if c.p.blocks() {
		w.hist.note("call %v, on its own goroutine", c)
		w.async(c)
		return
	}
	w.sync(rt, c)
}

// actDuplicate starts a call on a goroutine, with a ctx that may end
// before the key's execution does.
func (w *world) actDuplicate(rt *rapid.T) {
	via := rapid.SampledFrom([]string{"RunOnce", "Begin/finish"}).Draw(rt, "via")
	timeout := time.Duration(rapid.IntRange(50, 800).Draw(rt, "ctx ms")) * time.Millisecond
	c := &modelCall{ms: w.drawStore(rt), via: via, key: w.drawKey(rt), payload: "p", p: w.drawPlan(rt), timeout: timeout}
	w.hist.note("call %v, on its own goroutine, ctx %v", c, timeout)
	w.async(c)
}

// actUnblock lets one blocked execution end as it is told.
func (w *world) actUnblock(rt *rapid.T) {
	w.mu.Lock()
	n := len(w.gates)
	w.mu.Unlock()
	if n == 0 {
		return // nothing blocked
	}
	i := rapid.IntRange(0, n-1).Draw(rt, "gate")
	how := rapid.SampledFrom([]string{"ok", "ok", "fail", "final", "panic"}).Draw(rt, "how")
	w.mu.Lock()
	g := w.gates[i]
	w.gates = append(w.gates[:i], w.gates[i+1:]...)
	w.mu.Unlock()
	w.hist.note("unblock an execution of %s: %s", g.key, how)
	g.release(how)
}

// actCollect judges the calls on their own goroutines that have ended.
func (w *world) actCollect(rt *rapid.T) {
	w.collect(rt, false)
}

// collect judges the ended calls on their own goroutines; with wait, it
// waits for every one, each for a bounded time.
func (w *world) collect(rt *rapid.T, wait bool) {
	var left []*asyncCall
	for _, a := range w.pending {
		if wait {
			select {
			case <-a.done:
			case <-time.After(a.c.timeout + 4*modelSettle):
				w.fail(rt, "%v never returned", a.c)
			}
		}
		select {
		case <-a.done:
			w.hist.note("collected %v -> %v, %v (ran %v, took %v)", a.c, a.c.val, a.c.err, a.c.ran(), a.c.took.Round(time.Millisecond))
			if msg := w.check(a.c); msg != "" {
				w.fail(rt, "%v: %s", a.c, msg)
			}
		default:
			left = append(left, a)
		}
	}
	w.pending = left
}

// actForget forgets a key. The epoch ends if Forget says it did; calls
// that start while it runs may see either.
func (w *world) actForget(rt *rapid.T) {
	w.forget(rt, w.drawStore(rt), w.drawKey(rt))
}

func (w *world) forget(rt *rapid.T, ms *modelStore, key string) {
	p := w.hist.open(permit{why: "forget " + key, key: key, store: -1, resets: true, by: ms.id})
	ctx, cancel := context.WithTimeout(context.Background(), modelCallCtx)
	defer cancel()
	disturb0, faulted := w.disturbed.Load(), w.anyFault()
	err := w.admin(rt, "Forget", func() error { return ms.s.Forget(ctx, key) })
	var be *idem.BackendError
	if err != nil && errors.As(err, &be) && (faulted || ms.f.active()) {
		w.hist.closeMaybe(p) // the backend's delete may have landed, its reply lost
	} else {
		w.hist.close(p, err == nil)
	}
	w.hist.note("forget %s in store %d -> %v", key, ms.id, err)
	if err == nil {
		// The key starts afresh, unless renewals still fail: its next
		// owner's lease may lapse too, and the key be found interrupted.
		if len(w.renewing) == 0 {
			w.mu.Lock()
			delete(w.mayInterrupt, key)
			w.mu.Unlock()
		}
		w.unpin(key)
	}
	w.checkAdmin(rt, "Forget", err, disturb0, faulted, ms)
}

// errAdminExited is an operator's call whose goroutine the store's user
// code (its Codec, its Observer) ended.
var errAdminExited = errors.New("idemtest: the call's goroutine exited")

// admin makes an operator's call on a goroutine of its own, since the
// user's code inside the store may end it, and bounds its wait.
func (w *world) admin(rt *rapid.T, op string, call func() error) error {
	done := make(chan error, 1)
	go func() {
		err := errAdminExited
		defer func() { done <- err }()
		err = call()
	}()
	select {
	case err := <-done:
		return err
	case <-time.After(modelCallCtx + 4*modelSettle):
		w.fail(rt, "%s never returned", op)
		return nil
	}
}

// checkAdmin judges the error of an operator's call: a backend error only
// with a fault.
func (w *world) checkAdmin(rt *rapid.T, op string, err error, disturb0 int64, faulted bool, ms *modelStore) {
	if err == nil || faulted || w.disturbed.Load() != disturb0 || w.anyFault() || ms.killed {
		return
	}
	if isAny(err, idem.ErrInProgress, idem.ErrNotInterrupted, idem.ErrFull, errAdminExited) {
		return
	}
	var be *idem.BackendError
	if errorsAs(err, &be) {
		w.fail(rt, "%s in store %d: a backend error with no fault: %v", op, ms.id, err)
	}
}

func (w *world) actSweep(rt *rapid.T) {
	ms := w.drawStore(rt)
	disturb0, faulted := w.disturbed.Load(), w.anyFault()
	ctx, cancel := context.WithTimeout(context.Background(), modelCallCtx)
	defer cancel()
	var n int
	err := w.admin(rt, "Sweep", func() (err error) {
		n, err = ms.s.Sweep(ctx)
		return err
	})
	w.hist.note("sweep in store %d -> %d, %v", ms.id, n, err)
	w.checkAdmin(rt, "Sweep", err, disturb0, faulted, ms)
}

// actClock steps the stores' clock forward or back past every TTL and
// lease, or a little.
func (w *world) actClock(rt *rapid.T) {
	w.stepClock(rapid.SampledFrom([]time.Duration{modelStep, -modelStep, -3*time.Hour - 20*time.Minute, modelLease / 2, -modelLease / 2}).Draw(rt, "step"))
}

// stepClock steps the stores' clock by d, and notes what that permits.
func (w *world) stepClock(d time.Duration) {
	w.hist.note("clock steps %v", d)
	if d >= modelLease && !(w.h.ServerClock && w.b != nil) {
		// Noted before the step too: a call already waiting may claim
		// the key the moment the clock steps, before the permit after
		// the step is noted (a false alarm once in CI, memory model).
		w.hist.point(permit{why: "the clock is stepping past every TTL", store: -1, valid: true, completed: true, resets: true, at: w.clock.Now().Add(d)})
	}
	w.clock.step(d)
	w.disturb()
	if d >= modelLease || d <= -modelLease {
		w.unpin("") // a claim may be lost, and its outcome with it
	}
	if d <= -modelLease && !(w.h.ServerClock && w.b != nil) {
		w.steppedBack.Store(true)
	}
	if d < modelLease || w.h.ServerClock && w.b != nil {
		return // nothing lapses or expires on the backend's clock
	}
	// Every outcome expired. A lease that seems to lapse is no reason
	// for anything: its owner, if alive, renews it, and a store takes a
	// key over (or answers ErrOutcomeUnknown) only for an owner that
	// died or stalled (a kill, a renew outage), whatever the clock did.
	w.hist.point(permit{why: "the clock stepped past every TTL", store: -1, valid: true, completed: true, resets: true, at: w.clock.Now()})
}

// actStepPastLiveOwner is the clock stepping forward past a live owner's
// lease: an execution blocks in one store, the clock steps, and the other
// store calls the key (taking it over, with RetryInterrupted or Resume,
// were a lapse proof of death). Nothing permits the key to run again.
func (w *world) actStepPastLiveOwner(rt *rapid.T) {
	key := w.drawKey(rt)
	owner, other := w.stores[0], w.stores[len(w.stores)-1]
	w.hist.note("scenario: the clock steps past the lease of %s's live owner in store %d", key, owner.id)
	w.mu.Lock()
	full := len(w.gates) >= 3
	w.mu.Unlock()
	if !full {
		w.async(&modelCall{ms: owner, via: "RunOnce", key: key, payload: "p", p: plan{end: "block"}, timeout: modelCallCtx})
	}
	w.stepClock(modelStep)
	w.sync(rt, &modelCall{ms: other, via: "RunOnce", key: key, payload: "p", p: plan{end: "ok"}, timeout: modelCallCtx})
}

func (w *world) actSleep(rt *rapid.T) {
	w.hist.note("time passes: %v", modelLease*3/2)
	time.Sleep(modelLease * 3 / 2)
}

// actMisbehave makes a store's Codec or Observer misbehave once.
func (w *world) actMisbehave(rt *rapid.T) {
	ms := w.drawStore(rt)
	m := rapid.SampledFrom([]misbehaviour{misError, misPanic, misGoexit}).Draw(rt, "misbehaviour")
	where := "observer"
	if w.b != nil && rapid.Bool().Draw(rt, "codec") {
		where = "codec"
	}
	if where == "observer" && m == misError {
		m = misPanic
	}
	w.hist.note("store %d's %s will %v once", ms.id, where, m)
	ms.disturbs.Add(1)
	w.holdAll(forever) // an outcome it could not encode is held unrecorded
	w.troubled.Store(true)
	ms.u.mu.Lock()
	if where == "codec" {
		ms.u.marshal = m
	} else {
		ms.u.observer = m
	}
	ms.u.mu.Unlock()
	w.disturbAll()
	w.mu.Lock()
	for i := 0; i < modelKeys; i++ {
		w.panicked[w.key(i)] = w.panicked[w.key(i)] || m == misPanic
		w.exited[w.key(i)] = w.exited[w.key(i)] || m == misGoexit
	}
	w.mu.Unlock()
}
