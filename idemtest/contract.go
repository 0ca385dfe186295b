package idemtest

import (
	"bytes"
	"context"
	"reflect"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
)

// A Harness gives the contract suite fresh stores over one backend.
type Harness struct {
	// Backend returns a fresh, empty backend for one test, registering its
	// cleanup with t.Cleanup, or nil for a memory-only store. A nil
	// Backend func means memory-only too. Every store a test makes uses
	// the one backend it returned, so two stores over it see each other's
	// claims, as two processes over a shared database do.
	Backend func(t *testing.T) backend.Backend

	// Reopen, if set, closes b and returns a new Backend over the same data
	// (a real restart: bolt reopens its file); it is only called once no
	// store uses b. Nil: the restart and crash tests reuse b in a new
	// Store. They are skipped for memory-only stores.
	Reopen func(t *testing.T, b backend.Backend) backend.Backend

	// ReopenProvesDeath reports that Reopen finds the owners of the
	// records left pending dead (bolt: they held the file's lock) and
	// makes those records interrupted, with no lease left to judge
	// (backend.Record.WithOwnerDead). RunContract then checks that it
	// does. A shared backend, whose owners may live in other processes,
	// leaves it false.
	ReopenProvesDeath bool

	// ServerClock reports that the backend judges leases and expiry by its
	// server's clock and ignores Options.Now (postgres, redis). The suite
	// then skips the tests that move an injected Clock; those that wait
	// out short real durations run for every backend.
	ServerClock bool
}

// RunContract checks that stores over the backends h makes keep the
// contract of one key (DESIGN.md, "The contract"): coalescing, payload
// mismatch, release on failure, final errors, panics, expiry, leases and
// fencing, restarts and crashes, and callers whose ctx ends while they
// wait. Every test runs twice, through Store.RunOnce (subtest "RunOnce")
// and through the documented Begin pattern (subtest "Begin"). The tests
// that need a backend are skipped for a memory-only store.
//
// The suite runs its tests one at a time, on the real clock apart from
// the injected Clock tests, and takes a few seconds per entry point.
func RunContract(t *testing.T, h Harness) {
	if h.Backend != nil && h.Reopen != nil && h.ReopenProvesDeath {
		t.Run("ReopenInterruptsPending", func(t *testing.T) { testReopenInterruptsPending(t, h) })
	}
	for _, ep := range entryPoints {
		t.Run(ep.name, func(t *testing.T) {
			for _, tc := range contractTests {
				t.Run(tc.name, func(t *testing.T) {
					c := &contract{t: t, h: h, ep: ep}
					if h.Backend != nil {
						c.b = h.Backend(t)
					}
					tc.test(c)
				})
			}
		})
	}
}

// receipt is the result type of every store the suite makes.
type receipt struct{ N int }

// work is what a caller asks a store to run once.
type work = func(context.Context) (receipt, error)

// An entryPoint is one way to run a keyed operation on a store.
type entryPoint struct {
	name string
	call func(s *idem.Store[receipt], ctx context.Context, key string, payload any, fn work) (receipt, error)

	// panics: a panic in fn goes on up the caller's stack (after the key
	// was released) instead of coming back as a *PanicError.
	panics bool
	// leaves: the caller that runs fn returns when its ctx ends, while fn
	// goes on for the others; otherwise it does the work itself and returns
	// only with fn's outcome.
	leaves bool
}

var entryPoints = []entryPoint{
	{name: "RunOnce", call: viaRunOnce, leaves: true},
	{name: "Begin", call: viaBegin, panics: true},
}

func viaRunOnce(s *idem.Store[receipt], ctx context.Context, key string, payload any, fn work) (receipt, error) {
	return s.RunOnce(ctx, key, payload, fn)
}

// viaBegin is the pattern documented on Ticket.
func viaBegin(s *idem.Store[receipt], ctx context.Context, key string, payload any, fn work) (receipt, error) {
	tk, err := s.Begin(ctx, key, payload)
	if err != nil {
		return receipt{}, err
	}
	if tk.Replayed() {
		return tk.Result()
	}
	defer tk.Release()
	v, err := fn(tk.Context())
	return tk.Finish(v, err)
}

// contract is one test of the suite: its harness, entry point and backend.
type contract struct {
	t  *testing.T
	h  Harness
	ep entryPoint
	b  backend.Backend // nil for a memory-only store
}

// needBackend skips a test that needs stores over a backend.
func (c *contract) needBackend() {
	c.t.Helper()
	if c.b == nil {
		c.t.Skip("needs a backend: a memory-only store has no other store to share keys with, nor anything to restart")
	}
}

// store returns a new store over the test's backend (unless opts names
// one) that is closed when the test ends.
func (c *contract) store(opts idem.Options) *idem.Store[receipt] {
	if opts.Backend == nil && c.b != nil {
		opts.Backend = c.b
	}
	s := idem.New[receipt](opts)
	c.t.Cleanup(func() { _ = s.Close() })
	return s
}

// reopen restarts the test's backend, once no store uses it.
func (c *contract) reopen() {
	if c.h.Reopen != nil {
		c.b = c.h.Reopen(c.t, c.b)
	}
}

// run calls the entry point and reports a panic out of it as a failure.
// It may be called from any goroutine.
func (c *contract) run(s *idem.Store[receipt], ctx context.Context, key string, payload any, fn work) (receipt, error) {
	o := c.catch(s, ctx, key, payload, fn)
	if o.panicked != nil {
		c.t.Errorf("%s(%q) panicked: %v", c.ep.name, key, o.panicked)
	}
	return o.val, o.err
}

// result is what one call of an entry point ended with.
type result struct {
	val      receipt
	err      error
	panicked any // the value of a panic that came out of the call
}

// catch calls the entry point and recovers a panic that comes out of it.
func (c *contract) catch(s *idem.Store[receipt], ctx context.Context, key string, payload any, fn work) (o result) {
	defer func() {
		if v := recover(); v != nil {
			o = result{panicked: v}
		}
	}()
	o.val, o.err = c.ep.call(s, ctx, key, payload, fn)
	return o
}

// async calls the entry point on a new goroutine and delivers its result.
func (c *contract) async(s *idem.Store[receipt], ctx context.Context, key string, payload any, fn work) <-chan result {
	ch := make(chan result, 1)
	go func() { ch <- c.catch(s, ctx, key, payload, fn) }()
	return ch
}

// counting returns fn that counts its calls in calls and returns the
// count.
func counting(calls *atomic.Int32) work {
	return func(context.Context) (receipt, error) {
		return receipt{N: int(calls.Add(1))}, nil
	}
}

// A gate blocks fn until it is opened; opening it twice is harmless, so
// tests defer open to unblock fn when they fail half-way.
type gate struct {
	ch   chan struct{}
	once sync.Once
}

func newGate() *gate                    { return &gate{ch: make(chan struct{})} }
func (g *gate) open()                   { g.once.Do(func() { close(g.ch) }) }
func (g *gate) wait()                   { <-g.ch }
func (g *gate) opened() <-chan struct{} { return g.ch }

// contractTimeout bounds every wait of the suite that should end far
// sooner, so that a broken store fails a test instead of hanging it.
const contractTimeout = 10 * time.Second

// recv receives from ch, or fails the test after contractTimeout.
func recv[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	timer := time.NewTimer(contractTimeout)
	defer timer.Stop()
	select {
	case v := <-ch:
		return v
	case <-timer.C:
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

// within receives from ch and reports true, or reports false after d. It
// may be called from any goroutine.
func within[T any](ch <-chan T, d time.Duration) (T, bool) {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case v := <-ch:
		return v, true
	case <-timer.C:
		var zero T
		return zero, false
	}
}

// waitFrame begins the traceback line of idem's wait function, where a
// caller parks while its key is in flight in this process.
var waitFrame = []byte(reflect.TypeOf(idem.Options{}).PkgPath() + ".wait[")

// parked waits until at least n goroutines are parked in a store, waiting
// for an execution in flight in this process, and reports whether that
// happened within contractTimeout. The store has no public hook for it,
// so it reads the goroutines' stacks: a goroutine blocked in a select
// whose first frame outside the runtime is idem's wait. It may be called
// from any goroutine.
func parked(n int) bool {
	deadline := time.Now().Add(contractTimeout)
	buf := make([]byte, 1<<20)
	for {
		m := runtime.Stack(buf, true)
		if m == len(buf) {
			buf = make([]byte, 2*len(buf))
			continue
		}
		if countParked(buf[:m]) >= n {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(time.Millisecond) // polls for a state; orders nothing
	}
}

// countParked counts the goroutines of a runtime.Stack dump that are
// blocked in idem's wait, but the model's (RunModel's callers, which a
// plain go test runs beside the contract suite): only the suite's own.
func countParked(dump []byte) int {
	n := 0
	for _, g := range bytes.Split(dump, []byte("\n\n")) {
		lines := bytes.Split(g, []byte("\n"))
		if !bytes.Contains(lines[0], []byte(" [select")) || bytes.Contains(g, []byte("idemtest.(*world)")) {
			continue
		}
		for _, l := range lines[1:] {
			if bytes.HasPrefix(l, []byte("\t")) || bytes.HasPrefix(l, []byte("runtime.")) {
				continue
			}
			if bytes.HasPrefix(l, waitFrame) {
				n++
			}
			break
		}
	}
	return n
}

// poll calls cond until it holds, for at most contractTimeout, and reports
// whether it did: for leases and expiry judged by a clock the suite cannot
// move.
func poll(cond func() bool) bool {
	deadline := time.Now().Add(contractTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}
