package idemtest

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
)

// A modelCall is one call of a key, as the driver made it and as it ended.
type modelCall struct {
	ms       *modelStore
	via      string // "RunOnce", or "Begin" and how the ticket ends: "finish", "release", "drop"
	key      string
	payload  string
	p        plan
	timeout  time.Duration
	disturb0 int64 // the world's disturbance count when the call started
	faulted  bool  // a fault was planned for its store when it started
	// sharedFault: when it started, a call of its key was in flight in
	// its store with a fault in that call's window (sharesFault): it may
	// wait on that call's claim and answer the error it ends with.
	sharedFault   bool
	storeDisturb0 int64 // its store's disturbance count when it started
	seq0          int   // the history's clock when it started
	busy0         bool  // something held its key when it started
	mayInterrupt0 bool  // its key may have been interrupted when it started
	unpins0       int64 // the world's unpins when it started
	pin           *pin  // the outcome its store held unrecorded when it started

	exec atomic.Pointer[execEvent] // this call's own execution, once its fn runs (on the store's goroutine)
	// unrecorded is what the store's Observer was told, if its own
	// execution's final outcome was not recorded (on the store's goroutine).
	unrecorded atomic.Pointer[idem.NotRecordedError]
	val        receipt
	err        error
	exited     bool      // the call's goroutine ended with runtime.Goexit
	deadline   time.Time // when its ctx ends
	// sight is the last record of its key it read from the backend
	// (model_dead.go); its own execution reads on other goroutines.
	sightMu sync.Mutex
	sight   *sighting // guarded by sightMu
	took    time.Duration
	bounded time.Duration // the part of took that ctx bounds
}

func (c *modelCall) String() string {
	return fmt.Sprintf("%s(%s, payload %s) in store %d [%v]", c.via, c.key, c.payload, c.ms.id, c.p)
}

// An asyncCall is a call on a goroutine of its own, collected later.
type asyncCall struct {
	c    *modelCall
	done chan struct{}
}

// ran reports whether the call's own fn ran.
func (c *modelCall) ran() bool { return c.exec.Load() != nil }

// ownID is the id of the call's own execution, or 0.
func (c *modelCall) ownID() int {
	if e := c.exec.Load(); e != nil {
		return e.id
	}
	return 0
}

// prepare notes, on the driver's goroutine, what the model knew when the
// call c started.
func (w *world) prepare(c *modelCall) {
	c.seq0 = w.hist.now()
	w.mu.Lock()
	if w.tried[c.key] == nil {
		w.tried[c.key] = map[string]bool{}
	}
	w.tried[c.key][c.payload] = true // a claim with it may land, run or not
	w.mu.Unlock()
	c.disturb0 = w.disturbed.Load()
	c.storeDisturb0 = c.ms.disturbs.Load()
	c.unpins0 = w.unpins.Load()
	c.faulted = c.ms.f.active() || c.ms.u.pending()
	c.sharedFault = w.sharesFault(c)
	c.busy0 = w.busy(c.key)
	w.mu.Lock()
	c.mayInterrupt0 = w.mayInterrupt[c.key]
	w.mu.Unlock()
	if p, ok := w.pinOf(c.key); ok && p.store == c.ms.id && p.payload == c.payload {
		c.pin = &p
	}
}

// sharesFault reports whether c, about to start, may share the fate of a
// fault that hit another call: a call of c's key already in flight in
// c's store, whose claim c then waits on and whose error it answers, as
// every waiter in one process does (DESIGN.md, rule 2), and whose store
// had a fault planned at some time since that call started. The fault is
// then that call's to meet, whenever its Backend call runs: it may have
// taken a one-call fault already (none is planned any more when c starts,
// and its claim hangs until its ctx ends), or a fault planned after it
// started may meet its claim later (its goroutine had yet to send it). A
// call that ended has settled its claim: nothing of it is left to share.
// The driver's goroutine only, which owns w.pending.
func (w *world) sharesFault(c *modelCall) bool {
	for _, a := range w.pending {
		select {
		case <-a.done:
			continue
		default:
		}
		if a.c.ms == c.ms && a.c.key == c.key && (a.c.faulted || c.ms.disturbs.Load() != a.c.storeDisturb0) {
			return true
		}
	}
	return false
}

// callKey is the context key under which a call's ctx carries it, so
// that the Observer can tell the call its outcome was not recorded.
type callKey struct{}

// do makes the call c on this goroutine and fills in how it ended. A
// panic out of it (Begin's fn panics on up the caller's stack, as
// documented) is how the call ended; a Goexit too.
func (w *world) do(c *modelCall) {
	ctx, cancel := context.WithTimeout(context.WithValue(context.Background(), callKey{}, c), c.timeout)
	defer cancel()
	c.deadline, _ = ctx.Deadline()
	ran := w.fn(c.ms, c.key, c.payload, c.p, &c.exec)
	start := time.Now()
	returned := false
	defer func() {
		c.took = time.Since(start)
		if c.bounded == 0 {
			c.bounded = c.took
		}
		if v := recover(); v != nil {
			c.err = fmt.Errorf("panicked: %v", v)
			if _, ours := v.(string); !ours {
				c.err = fmt.Errorf("panicked: %v\n%s", v, debug.Stack())
			}
			return
		}
		c.exited = !returned
	}()
	if c.via == "RunOnce" {
		c.val, c.err = c.ms.s.RunOnce(ctx, c.key, c.payload, ran)
		returned = true
		return
	}
	tk, err := c.ms.s.Begin(ctx, c.key, c.payload)
	c.bounded = time.Since(start)
	if err != nil {
		c.err, returned = err, true
		return
	}
	if tk.Replayed() {
		v, err := tk.Result()
		c.val, c.err, returned = v, err, true
		return
	}
	switch strings.TrimPrefix(c.via, "Begin/") {
	case "finish":
		defer tk.Release()
		v, err := ran(tk.Context())
		c.val, c.err = tk.Finish(v, err)
	case "release":
		defer tk.Release() // a panic in fn releases the key, and goes on up
		v, err := ran(tk.Context())
		p := w.hist.open(permit{why: "ticket released", key: c.key, store: -1, exec: c.ownID()})
		tk.Release()
		w.hist.close(p, true)
		c.val, c.err = v, err
	case "drop": // the ticket is garbage; its finalizer releases the key
		w.hold(c.key, forever) // until the garbage collector runs
		v, err := ran(tk.Context())
		w.hist.point(permit{why: "ticket dropped", key: c.key, store: -1, valid: true, exec: c.ownID()})
		runtime.KeepAlive(tk) // not collected while its work runs
		c.val, c.err = v, err
	}
	returned = true
}

// async makes the call c on a goroutine of its own.
func (w *world) async(c *modelCall) {
	w.prepare(c)
	w.launch(c)
}

// launch starts the call c, prepared, on a goroutine of its own.
func (w *world) launch(c *modelCall) {
	a := &asyncCall{c: c, done: make(chan struct{})}
	go func() {
		defer close(a.done)
		w.do(c)
	}()
	w.pending = append(w.pending, a)
}

// check judges how call c ended against what the model allows, and
// returns what is wrong, if anything.
func (w *world) check(c *modelCall) string {
	busy := w.busy(c.key)
	// storeDisturbed: something was wrong with the call's own store (a
	// fault, its user code, its death): the backend errors it may give.
	// A call that ran no fn of its own waited on another's claim or
	// execution, and answers its error: a fault that call may have met
	// counts too (sharesFault).
	storeDisturbed := c.faulted || c.ms.disturbs.Load() != c.storeDisturb0 || c.ms.f.active() || c.ms.u.pending() || c.ms.killed || c.ms.closed.Load() ||
		c.sharedFault && !c.ran()
	disturbed := storeDisturbed || w.disturbed.Load() != c.disturb0
	if c.bounded > c.timeout+modelSlack {
		return fmt.Sprintf("took %v, %v of it past the caller's %v ctx", c.took, c.bounded-c.timeout, c.timeout)
	}
	oks, finals, execs := w.hist.outcomes(c.key, c.seq0, c.ms.id)
	w.mu.Lock()
	for v := range w.resolved[c.key] {
		oks[v] = true
	}
	mayInterrupt, panicked, exited := w.mayInterrupt[c.key] || c.mayInterrupt0, w.panicked[c.key], w.exited[c.key]
	w.mu.Unlock()
	err := c.err
	if p := c.pin; p != nil {
		// Only a pin that held for the whole call binds its answer: one
		// unpinned meanwhile (a Forget, a lapse) and pinned anew (another
		// execution's unrecorded outcome) binds nothing.
		if now, still := w.pinOf(c.key); still && now == *p && w.unpins.Load() == c.unpins0 && (c.ran() || c.val.N != p.value) {
			return fmt.Sprintf("store %d held %d unrecorded for the key, yet answered %d, %v (ran %v)", p.store, p.value, c.val.N, err, c.ran())
		}
	}
	if c.exited {
		// The user's code ended the call's goroutine: an outcome it was
		// recording is held, unrecorded, until its store closes.
		w.mu.Lock()
		w.heldBy[c.key] = c.ms
		w.mu.Unlock()
		if exited || disturbed {
			return ""
		}
		return "the call's goroutine exited"
	}
	var ee execError
	var be *idem.BackendError
	var pe *idem.PanicError
	// The Observer hears of an outcome of the call's own execution held
	// unrecorded (a success or a final error) before the call is answered.
	if nr := c.unrecorded.Load(); nr != nil {
		if !disturbed && !w.troubled.Load() {
			return "an outcome not recorded with no fault: " + nr.Error()
		}
		if why := nr.Err.Error(); strings.Contains(why, "Codec") || strings.Contains(why, "Goexit") {
			// An outcome that could not be encoded is held, its lease
			// renewed, until its store closes: documented.
			w.mu.Lock()
			w.heldBy[c.key] = c.ms
			w.mu.Unlock()
		}
		// A claim lost to another owner holds nothing: later calls read
		// whatever the backend holds now.
		if lost := errors.Is(nr.Err, backend.ErrNotOwner); lost {
			w.hold(c.key, settled())
		} else {
			w.hold(c.key, forever) // until it is recorded, after a heal
			// A claim that may have been lost while the call ran (a
			// clock step, a renew outage, a drop), or that will be (its
			// store's renewals fail, since before the call), pins nothing
			// sure.
			sure := w.unpins.Load() == c.unpins0 && (err == nil || idem.IsFinal(err)) && !c.ms.f.renewalsFail()
			if sure && (!c.ms.killed && !c.ms.closed.Load() && !strings.HasPrefix(c.via, "Begin/") || c.via == "Begin/finish") {
				w.mu.Lock()
				w.pins[c.key] = pin{store: c.ms.id, value: c.val.N, payload: c.payload}
				w.mu.Unlock()
			}
		}
	}
	switch {
	case idem.IsFinal(err):
		known := false
		for f := range finals {
			known = known || strings.HasPrefix(err.Error(), f)
		}
		if !known {
			return fmt.Sprintf("a final error no execution of the key returned: %v", err)
		}
	case err == nil:
		if c.ran() && strings.HasPrefix(c.via, "Begin/") && c.via != "Begin/finish" {
			return "" // the caller's own fn's answer, not the store's
		}
		if e := c.exec.Load(); e != nil {
			if outcome, value := w.hist.ended(e); outcome == "ok" && c.val.N != value {
				return fmt.Sprintf("ran its own fn, which returned %d, but answered %d", value, c.val.N)
			}
		}
		if !oks[c.val.N] {
			return fmt.Sprintf("succeeded with %d, which no execution of the key returned (successes %v)", c.val.N, oks)
		}
	case errors.As(err, &ee):
		if _, ok := execs[ee.id]; !ok {
			return fmt.Sprintf("another key's error: %v", err)
		}
	case errors.Is(err, idem.ErrPayloadMismatch):
		w.mu.Lock()
		other := len(w.tried[c.key]) > 1 || !w.tried[c.key][c.payload]
		w.mu.Unlock()
		if !other {
			return "ErrPayloadMismatch, but the key never ran with another payload"
		}
	case errors.Is(err, idem.ErrInProgress):
		if !busy && !c.busy0 && !w.heldByDead(c) {
			return "ErrInProgress, but nothing held the key: " + err.Error()
		}
	case errors.Is(err, idem.ErrOutcomeUnknown):
		if !mayInterrupt || w.b == nil {
			return "ErrOutcomeUnknown, but no owner of the key died or lost its claim"
		}
	case errors.Is(err, idem.ErrFull):
		if w.opts.MaxKeys <= 0 {
			return "ErrFull with no MaxKeys"
		}
	case errors.As(err, &pe):
		if !panicked && !disturbed {
			return fmt.Sprintf("a panic no execution of the key made: %v", pe.Value)
		}
	case errors.As(err, &be) || errors.Is(err, idem.ErrClosed):
		if !storeDisturbed {
			return "a backend error with no fault: " + err.Error()
		}
	case strings.Contains(err.Error(), "Goexit") || strings.Contains(err.Error(), "exited its goroutine"):
		if !exited && !disturbed {
			return "a Goexit no execution made: " + err.Error()
		}
	case strings.HasPrefix(err.Error(), "panicked: "):
		// Only Begin's own fn panics on up its caller's stack; nothing
		// else may let a panic out of the library.
		e := c.exec.Load()
		if e == nil || !strings.HasPrefix(c.via, "Begin/") {
			return "a panic escaped the store: " + err.Error()
		}
		if outcome, _ := w.hist.ended(e); outcome != "panic" {
			return "a panic escaped the store: " + err.Error()
		}
	case strings.Contains(err.Error(), "released before it finished") || strings.Contains(err.Error(), "dropped without Finish"):
		// a Begin owner released or dropped its ticket, and this call
		// waited on it
	default:
		if !disturbed {
			return "an error the model does not know: " + err.Error()
		}
	}
	return ""
}
