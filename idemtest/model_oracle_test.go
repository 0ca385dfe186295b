package idemtest

// Tests of RunModel's own oracle and driver: each pins a verdict the model
// must reach, and its comment says the mistake it rules out (each failed
// on the model as first written).

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
)

// handWorld is a memory-only world built by hand, with no rapid.T: the
// oracle (check, judge) and the driver's do/async need none.
func handWorld(t *testing.T) *world {
	w := emptyWorld(t, fmt.Sprintf("hand-%d", sequences.Add(1)))
	w.opts = idem.Options{TTL: modelTTL, SweepInterval: -1, Now: w.clock.Now}
	w.stores = []*modelStore{w.open(0)}
	t.Cleanup(w.end)
	return w
}

// A failure permit is key-wide (store -1) and not tied to the execution
// that failed: a zombie execution X (its lease lost, the key legitimately
// taken by A) that then fails grants a permit that lets B run while A
// still owns the key. A backend whose Release ignored the token (X's
// release deleting A's claim) double-executes and the model stays silent.
func TestJudgeFlagsARunAfterAZombieOwnersFailure(t *testing.T) {
	h := newHistory()
	key := "k"
	x := h.startExec(1, key, 0, "p")
	h.point(permit{why: "exec 1 lost its lease", key: key, store: 0, valid: true})
	a := h.startExec(2, key, 1, "p")                // legit: X lost its lease
	h.endExec(x, "fail", false, 0, "", time.Time{}) // the zombie fails: its (token-less) release frees A's key
	h.startExec(3, key, 0, "p")                     // B runs while A has not ended
	_ = a
	if v := h.judge(); len(v) == 0 {
		t.Fatalf("exec 3 ran while exec 2 owned the key, and nothing ended exec 2's epoch; judge saw no violation\n%s", h.trace())
	}
}

// Same with a released ticket: the permit is recorded after Release
// returned (model_calls.go do, "release"), key-wide, so the release of
// any ticket (even one whose claim another owner has taken over) opens
// the current owner's epoch.
func TestJudgeFlagsARunAfterAStaleTicketsRelease(t *testing.T) {
	h := newHistory()
	key := "k"
	x := h.startExec(1, key, 0, "p") // a Begin owner
	h.point(permit{why: "exec 1 lost its lease", key: key, store: 0, valid: true})
	h.startExec(2, key, 1, "p") // legit takeover, A
	h.endExec(x, "ok", false, 0, "", time.Time{})
	h.point(permit{why: "ticket released", key: key, store: -1, valid: true, exec: x.id}) // X's ticket released, as do records it
	h.startExec(3, key, 1, "p")                                                           // B, while A runs
	if v := h.judge(); len(v) == 0 {
		t.Fatalf("exec 3 ran while exec 2 owned the key; judge saw no violation\n%s", h.trace())
	}
}

// clockHeld (troubled && steppedBack, both sticky for the whole sequence)
// makes busy() true for every key: ErrInProgress is then never judged,
// and quiesce's probe skips its stuck-key check. In a memory-only world
// there is no lease for a clock step to lengthen, and a misbehaving
// Observer (which sets troubled) leaves no claim to lapse: a key stuck in
// flight forever passes. About half of all sequences have both flags.
func TestCheckRefusesInProgressOnAFreeKeyInMemoryOnly(t *testing.T) {
	w := handWorld(t)
	w.troubled.Store(true)    // actMisbehave, long ago, healed
	w.steppedBack.Store(true) // actClock -2h, perhaps stepped forward again since
	c := &modelCall{ms: w.stores[0], via: "RunOnce", key: w.key(0), payload: "p", timeout: modelCallCtx,
		err: fmt.Errorf("%w: %w", idem.ErrInProgress, context.DeadlineExceeded)}
	if msg := w.check(c); msg == "" {
		t.Fatal("ErrInProgress on a key nothing holds, in a store with no backend and so no lease, was accepted")
	}
}

// A panic out of RunOnce is never documented (RunOnce returns fn's panic
// as a *PanicError, and the Observer's and Codec's panics are recovered),
// yet check accepts any "panicked: ..." (even a runtime error inside the
// library, as the Span bug this change fixes was) once any execution of
// the key panicked or any misbehaviour was planned, which actMisbehave
// marks for every key.
func TestCheckRefusesALibraryPanic(t *testing.T) {
	w := handWorld(t)
	w.flag(w.panicked, w.key(0)) // an earlier execution of the key panicked, as drawn
	c := &modelCall{ms: w.stores[0], via: "RunOnce", key: w.key(0), payload: "p", timeout: modelCallCtx,
		err: errors.New("panicked: runtime error: invalid memory address or nil pointer dereference\ngoroutine 1 [running]: idem.(*Store).begin")}
	c.disturb0 = w.disturbed.Load()
	if msg := w.check(c); msg == "" {
		t.Fatal("a nil-pointer panic out of RunOnce was accepted")
	}
}

// A replay is checked against every value the key ever succeeded with,
// across epochs: after Forget and a new execution, a replay of the
// forgotten outcome (a stale cache entry, a Forget that missed memory)
// passes.
func TestCheckRefusesAReplayOfAForgottenOutcome(t *testing.T) {
	w := handWorld(t)
	key := w.key(0)
	e1 := w.hist.startExec(1, key, 0, "p")
	w.hist.endExec(e1, "ok", false, 10, "", time.Time{})
	p := w.hist.open(permit{why: "forget", key: key, store: -1, resets: true})
	w.hist.close(p, true)
	e2 := w.hist.startExec(2, key, 0, "p")
	w.hist.endExec(e2, "ok", false, 20, "", time.Time{})
	c := &modelCall{ms: w.stores[0], via: "RunOnce", key: key, payload: "p", timeout: modelCallCtx, val: receipt{N: 10}}
	w.prepare(c)
	if msg := w.check(c); msg == "" {
		t.Fatal("a replay of 10, forgotten and replaced by 20, was accepted")
	}
}

// mayInterrupt is set for every key by any fault, misbehaviour or clock
// step, and cleared only by a successful Forget: after one heal and a
// fresh successful execution, ErrOutcomeUnknown is still accepted.
func TestCheckRefusesOutcomeUnknownAfterAHeal(t *testing.T) {
	w := handWorld(t)
	key := w.key(0)
	w.disturbAll() // an Observer misbehaved once, long ago
	w.heal()
	e := w.hist.startExec(1, key, 0, "p")
	w.hist.endExec(e, "ok", false, 1, "", time.Time{}) // the key then ran and succeeded, untroubled
	c := &modelCall{ms: w.stores[0], via: "RunOnce", key: key, payload: "p", timeout: modelCallCtx, err: idem.ErrOutcomeUnknown}
	c.disturb0 = w.disturbed.Load()
	if msg := w.check(c); msg == "" {
		t.Fatal("ErrOutcomeUnknown from a memory-only store, whose key just succeeded, was accepted")
	}
}

// Under -race: async starts the call's goroutine, whose do() reads
// w.pending in busy(), and then appends to w.pending, unsynchronised.
func TestAsyncTracksPendingCallsWithoutARace(t *testing.T) {
	w := handWorld(t)
	for i := 0; i < 4; i++ {
		w.async(&modelCall{ms: w.stores[0], via: "RunOnce", key: w.key(i % 2), payload: "p", p: plan{end: "ok"}, timeout: modelCallCtx})
	}
	for _, a := range w.pending {
		<-a.done
	}
}

// Under -race: RunOnce returns at its ctx while its fn still runs on the
// store's goroutine, which writes c.ran; the driver then reads c.ran (in
// sync's note and in check) with no synchronisation.
func TestCallRanIsReadWithoutARace(t *testing.T) {
	w := handWorld(t)
	c := &modelCall{ms: w.stores[0], via: "RunOnce", key: w.key(0), payload: "p", p: plan{end: "block"}, timeout: 50 * time.Millisecond}
	done := make(chan struct{})
	go func() { defer close(done); w.do(c) }()
	<-done
	_ = fmt.Sprint(c.ran()) // as sync's note does
	w.mu.Lock()
	gates := w.gates
	w.gates = nil
	w.mu.Unlock()
	for _, g := range gates {
		g.release("ok")
	}
}

// Begin/drop calls ran(tk.Context()) and only then records the "ticket
// dropped" permit and the hold; but tk is dead once tk.Context() has
// returned, so a GC while the work is blocked runs the finalizer, which
// releases the key and cancels the work mid-run. The model means "dropped
// after the work"; what it gets is a key freed while an execution it
// believes owns the key runs, with the permit recorded after, so that
// another store's execution that starts in between is judged a double
// execution (false positive), and busy() has no hold yet.
func TestDriverKeepsADroppedTicketUntilItsWorkEnds(t *testing.T) {
	w := handWorld(t)
	key := w.key(0)
	c := &modelCall{ms: w.stores[0], via: "Begin/drop", key: key, payload: "p", p: plan{end: "block"}, timeout: modelCallCtx}
	w.async(c)
	deadline := time.Now().Add(2 * time.Second)
	for {
		w.mu.Lock()
		n := len(w.gates)
		w.mu.Unlock()
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the execution never blocked")
		}
		time.Sleep(5 * time.Millisecond)
	}
	for i := 0; i < 3; i++ {
		runtime.GC()
		time.Sleep(50 * time.Millisecond)
	}
	running := w.hist.running(key)
	w.mu.Lock()
	for _, g := range w.gates {
		g.release("ok")
	}
	w.gates = nil
	w.mu.Unlock()
	<-w.pending[0].done
	if !running {
		t.Fatalf("the dropped ticket was collected while its work ran (the driver had not let it go): the execution ended early\n%s", w.hist.trace())
	}
}
