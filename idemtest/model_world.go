package idemtest

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/internal/lifecycle"
	"pgregory.net/rapid"
)

// The model's timings. The lease is short so that time passing on the
// real clock lets it lapse within a run, and long enough that an owner
// alive on a loaded CI machine renews it in time.
const (
	modelLease   = 600 * time.Millisecond
	modelSettle  = 2 * time.Second
	modelCallCtx = 400 * time.Millisecond // a synchronous call's ctx
	// modelSlack is how far past its ctx a call may return: the
	// store's own bookkeeping, never a backend call it waits out.
	modelSlack = 1200 * time.Millisecond
	modelTTL   = time.Hour
	modelStep  = 2 * time.Hour // a clock step: past every TTL and lease
)

// A world is one sequence of the model: the stores under test, their
// fault plans, the clock, the calls in flight and the history.
type world struct {
	t       *testing.T
	rt      *rapid.T
	failing *atomic.Bool // a failure was found: rapid is shrinking it
	strays  int          // lifecycle.Strays as the sequence began
	h       Harness
	b       backend.Backend // nil for memory only

	name   string // this sequence's key prefix
	clock  *steppedClock
	opts   idem.Options // every store's, but Backend, Codec and Observer
	stores []*modelStore
	hist   *history

	nextID   atomic.Int64
	gates    []*execGate // blocked executions, oldest first
	draining atomic.Bool // quiescing: executions no longer block
	// troubled: a store died or a backend fault was planned, so a claim
	// may be left to lapse; steppedBack: the clock the backend judges
	// leases by stepped back.
	troubled, steppedBack atomic.Bool
	pending               []*asyncCall // calls on their own goroutines, oldest first

	disturbed atomic.Int64 // counts faults, kills, clock steps and misbehaviour
	// mayInterrupt: a key some disturbance may have left interrupted
	// (ErrOutcomeUnknown is then a documented answer).
	mu           sync.Mutex
	mayInterrupt map[string]bool            // guarded by mu
	panicked     map[string]bool            // guarded by mu; keys an execution or hook panicked in
	exited       map[string]bool            // guarded by mu; keys an execution or hook Goexited in
	resolved     map[string]map[int]bool    // guarded by mu; the values an operator gave each key
	heldUntil    map[string]time.Time       // guarded by mu; until when something may hold a key (model_busy.go)
	pins         map[string]pin             // guarded by mu; outcomes a store holds unrecorded
	unpins       atomic.Int64               // how many times pins were dropped: a claim may have been lost
	tried        map[string]map[string]bool // guarded by mu; the payloads each key was called with
	heldBy       map[string]*modelStore     // guarded by mu; the store that holds a key's unencodable outcome until it closes

	renewing []*permit     // the windows of renew outages not yet healed
	dead     []*modelStore // killed stores, closed at the end
	all      []*modelStore // every store opened, dead, closed or live
	storeIDs int           // the last store id given
}

// A modelStore is one store of the world, as one process.
type modelStore struct {
	id     int
	s      *idem.Store[receipt]
	f      *faults
	u      *userCode
	killed bool        // its process is dead: its backend calls are refused
	closed atomic.Bool // Close was called
	// disturbs counts what went wrong with this store: faults planned
	// and healed, misbehaviour, its death.
	disturbs atomic.Int64
}

var sequences atomic.Int64

func newWorld(t *testing.T, rt *rapid.T, h Harness, failing *atomic.Bool) *world {
	w := emptyWorld(t, fmt.Sprintf("m%d-%d", time.Now().UnixNano()%1e6, sequences.Add(1)))
	w.rt, w.h, w.failing = rt, h, failing
	w.strays, _ = lifecycle.Strays()
	if h.Backend != nil {
		w.b = sharedBackend(t, h)
	}
	// A settle shorter than a call's ctx lets the call hear that its
	// outcome was not recorded; a longer one shows what a call waits out.
	settle := modelSettle
	if w.b != nil && rapid.Bool().Draw(rt, "short settle") {
		settle = modelCallCtx * 3 / 4
	}
	w.opts = idem.Options{
		TTL:           modelTTL,
		Lease:         modelLease,
		SettleTimeout: settle,
		SweepInterval: -1,
		Now:           w.clock.Now,
	}
	if w.b != nil {
		w.opts.RetryInterrupted = rapid.Bool().Draw(rt, "RetryInterrupted")
		if _, ok := w.b.(backend.Stepper); ok {
			w.opts.Resume = rapid.Bool().Draw(rt, "Resume")
		}
	}
	if rapid.IntRange(0, 3).Draw(rt, "bounded") == 0 {
		w.opts.MaxKeys = rapid.IntRange(1, 2).Draw(rt, "MaxKeys")
	}
	if rapid.IntRange(0, 3).Draw(rt, "timed") == 0 {
		w.opts.ExecutionTimeout = 3 * modelLease
	}
	w.hist.note("options: RetryInterrupted %v, Resume %v, MaxKeys %d, ExecutionTimeout %v",
		w.opts.RetryInterrupted, w.opts.Resume, w.opts.MaxKeys, w.opts.ExecutionTimeout)
	n := 1
	if w.b != nil {
		n = 2
	}
	for i := 0; i < n; i++ {
		w.stores = append(w.stores, w.open(i))
	}
	w.storeIDs = n - 1
	return w
}

// emptyWorld returns a world with no stores, no options and nothing in its
// history, whose keys start with name.
func emptyWorld(t *testing.T, name string) *world {
	return &world{
		t:            t,
		name:         name,
		clock:        &steppedClock{},
		hist:         newHistory(),
		failing:      new(atomic.Bool),
		mayInterrupt: map[string]bool{},
		panicked:     map[string]bool{},
		exited:       map[string]bool{},
		resolved:     map[string]map[int]bool{},
		heldUntil:    map[string]time.Time{},
		pins:         map[string]pin{},
		tried:        map[string]map[string]bool{},
		heldBy:       map[string]*modelStore{},
	}
}

// The backend of one RunModel call, made once and kept across its
// sequences (each uses keys of its own), so that a database is not set up
// a hundred times. A crash replaces it.
var shared sync.Map // *testing.T -> *backend.Backend

func sharedBackend(t *testing.T, h Harness) backend.Backend {
	if b, ok := shared.Load(t); ok {
		return *b.(*backend.Backend)
	}
	b := h.Backend(t)
	shared.Store(t, &b)
	t.Cleanup(func() { shared.Delete(t) })
	return b
}

func setSharedBackend(t *testing.T, b backend.Backend) { shared.Store(t, &b) }

// open makes store i of the world, with a fault plan of its own.
func (w *world) open(i int) *modelStore {
	ms := &modelStore{id: i, f: newFaults(), u: &userCode{}}
	ms.u.heard = w.heardUnrecorded
	opts := w.opts
	if w.b != nil {
		opts.Backend = wrap(w.b, ms.f)
		opts.Codec = modelCodec{ms.u}
	}
	opts.Observer = ms.u.observerHooks()
	ms.s = idem.New[receipt](opts)
	w.all = append(w.all, ms)
	return ms
}

func (w *world) key(i int) string { return fmt.Sprintf("%s-k%d", w.name, i) }

// disturb counts an event that makes more answers documented.
func (w *world) disturb(keys ...string) {
	w.disturbed.Add(1)
	w.mu.Lock()
	for _, k := range keys {
		w.mayInterrupt[k] = true
	}
	w.mu.Unlock()
}

// disturbAll marks every key used so far.
func (w *world) disturbAll() {
	keys := []string{}
	for i := 0; i < modelKeys; i++ {
		keys = append(keys, w.key(i))
	}
	w.disturb(keys...)
}

func (w *world) flag(m map[string]bool, key string) {
	w.mu.Lock()
	m[key] = true
	w.mu.Unlock()
}

// anyFault reports whether a fault or misbehaviour is planned anywhere.
func (w *world) anyFault() bool {
	for _, ms := range w.stores {
		if ms.f.active() || ms.u.pending() {
			return true
		}
	}
	return false
}

// clockHeld reports whether a claim left to lapse may look live for as
// long as a clock step back: it keeps the lease it had, by a clock that
// now reads earlier, as documented for Options.Now.
func (w *world) clockHeld() bool {
	return w.b != nil && w.troubled.Load() && w.steppedBack.Load() && w.clock.behind()
}

// steppedClock is the real clock plus an offset that steps move, as NTP
// steps a host's wall clock: time passes, and jumps.
type steppedClock struct {
	mu     sync.Mutex
	offset time.Duration // guarded by mu
	most   time.Duration // guarded by mu; the largest offset it had
}

// behind reports whether the clock reads earlier than it once did: a
// lease it granted then may still lie ahead.
func (c *steppedClock) behind() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.offset < c.most
}

// untilAhead returns the step that puts the clock d past the latest time
// it ever read.
func (c *steppedClock) untilAhead(d time.Duration) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.most - c.offset + d
}

func (c *steppedClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.offset).Round(0)
}

func (c *steppedClock) step(d time.Duration) {
	c.mu.Lock()
	c.offset += d
	c.most = max(c.most, c.offset)
	c.mu.Unlock()
}

// An execGate holds a blocked execution until the driver ends it.
type execGate struct {
	key  string
	ch   chan struct{}
	once sync.Once
	end  atomic.Value // string: how the execution ends once let go
}

func (g *execGate) release(how string) {
	g.once.Do(func() {
		g.end.Store(how)
		close(g.ch)
	})
}

// execError is an execution's own error.
type execError struct {
	id int
}

func (e execError) Error() string { return fmt.Sprintf("idemtest: exec %d failed", e.id) }

func finalMsg(id int) string { return fmt.Sprintf("idemtest: exec %d failed for good", id) }

// A plan is what one execution does: its steps, then its end.
type plan struct {
	steps []string // each "ok", "fail", "panic" or "block"
	end   string   // "ok", "fail", "final", "panic", "goexit" or "block"
}

func (p plan) String() string { return fmt.Sprintf("steps %v then %s", p.steps, p.end) }

// fn returns the work of one call: an execution of key in store ms that
// reports itself to the history and does what p says.
func (w *world) fn(ms *modelStore, key, payload string, p plan, started *atomic.Pointer[execEvent]) work {
	return func(ctx context.Context) (receipt, error) {
		id := int(w.nextID.Add(1))
		e := w.hist.startExec(id, key, ms.id, payload)
		started.Store(e)
		stop := w.watchLease(ctx, e)
		defer stop()
		outcome, leftStep, value, finalErr := "goexit", false, 0, ""
		defer func() {
			if v := recover(); v != nil {
				w.flag(w.panicked, key)
				w.hist.endExec(e, "panic", leftStep, 0, "", w.clock.Now())
				panic(v)
			}
			if outcome == "goexit" {
				w.flag(w.exited, key)
			}
			w.hist.endExec(e, outcome, leftStep, value, finalErr, w.clock.Now())
		}()
		for i, s := range p.steps {
			name := fmt.Sprintf("s%d", i)
			ran := false
			v, err := idem.Step(ctx, name, func(ctx context.Context) (int, error) {
				ran = true
				w.hist.stepRuns(key, name, id)
				return w.behave(ctx, key, s, id*10+i, e)
			})
			recorded := err == nil && ran && w.opts.Resume
			w.hist.stepDone(key, name, v, ran, recorded)
			leftStep = leftStep || recorded || (err == nil && !ran)
			if err != nil {
				outcome = "fail"
				if idem.IsFinal(err) {
					outcome, finalErr = "final", err.Error()
				}
				return receipt{}, err
			}
		}
		v, err := w.behave(ctx, key, p.end, id, e)
		switch {
		case err == nil:
			outcome, value = "ok", v
		case idem.IsFinal(err):
			outcome, finalErr = "final", err.Error()
		default:
			outcome = "fail"
		}
		return receipt{N: v}, err
	}
}

// behave does what an execution or a step is told to; id is its success's
// value.
func (w *world) behave(ctx context.Context, key, how string, id int, e *execEvent) (int, error) {
	if how == "block" && w.draining.Load() {
		how = "ok"
	}
	if how == "block" {
		g := &execGate{key: key, ch: make(chan struct{})}
		w.mu.Lock()
		w.gates = append(w.gates, g)
		w.mu.Unlock()
		select {
		case <-g.ch:
			how = g.end.Load().(string)
		case <-ctx.Done(): // ExecutionTimeout, a lost lease, Close
			return 0, execError{e.id}
		}
	}
	switch how {
	case "ok":
		return id, nil
	case "final":
		return 0, idem.Final(fmt.Errorf("%s", finalMsg(e.id)))
	case "panic":
		panic(fmt.Sprintf("idemtest: exec %d panics", e.id))
	case "goexit":
		runtime.Goexit()
	}
	return 0, execError{e.id}
}

// watchLease records a permit when the store tells an execution its lease
// is lost: another owner may then take the key, as documented.
func (w *world) watchLease(ctx context.Context, e *execEvent) (stop func()) {
	done := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			if errors.Is(context.Cause(ctx), idem.ErrLeaseLost) {
				// The lease may have lapsed at any time since the
				// execution began: this goroutine may run late.
				w.hist.lost(e)
			}
		case <-done:
		}
	}()
	return func() { close(done) }
}
