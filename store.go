package idem

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// A Store runs each keyed operation at most once and remembers its outcome.
// Create one with New (the zero Store is not usable); it is safe for use by
// many goroutines. Close it to stop its sweeper and wait for executions in
// flight.
type Store[R any] struct {
	opts   Options // with defaults applied; read-only after New
	table  *table[R]
	b      guarded     // opts.Backend, every call guarded; zero without one
	closed atomic.Bool // set by Close before the table refuses claims

	misuse error // why the options cannot run as asked; every claim returns it
	// sysClock: Options.Now was nil, so the clock is time.Now, which
	// neither panics nor ends the goroutine.
	sysClock bool
	// epoch is when the store was made, read from the system clock; now
	// measures the system clock's time from it.
	epoch time.Time

	closeOnce sync.Once
	closeDone chan struct{} // closed once closing has finished
	stop      chan struct{} // closed by Close to stop the sweeper
	swept     chan struct{} // closed by the sweeper when it exits; nil if there is none

	// stopping is cancelled as Close begins: it ends polls of a key held
	// elsewhere. closing is cancelled once executions have finished: it ends
	// the goroutines in background, which settle backend writes on their
	// own (releaseLater) or renew a lease, and Close waits for them.
	stopping, closing       context.Context
	endStopping, endClosing context.CancelFunc
	background              sync.WaitGroup
	telling                 atomic.Int64 // executions whose end the Observer is being told; in background too
	// recording counts the outcomes held in memory that completeLater
	// is still writing to the Backend; each that ends sends on recorded.
	// Close waits for them (SettleTimeout at most), and abandoned is how
	// many it gave up on.
	recording atomic.Int64
	recorded  chan struct{}
	abandoned atomic.Int64
	releases  releaser      // claims of unknown fate, released in the background
	leases    leaseQueue[R] // durable claims whose first renewal is not yet due
	// unwritable counts the outcomes held in memory that no write can
	// record (the Codec could not encode them): their claims are held
	// until Close, which then leaves them to their leases.
	unwritable atomic.Int64
	// unreleased is how many of those claims closing gave up on; set
	// before closeDone is closed.
	unreleased int
}

// testHookWait, if set, runs each time a caller starts waiting for an
// execution in flight. Tests use it to know that duplicates are parked.
var testHookWait func()

// New returns a Store configured by opts and starts its background sweeper.
func New[R any](opts Options) *Store[R] {
	s := &Store[R]{
		opts:      opts.withDefaults(),
		misuse:    opts.check(),
		stop:      make(chan struct{}),
		closeDone: make(chan struct{}),
		recorded:  make(chan struct{}, 1),
		sysClock:  opts.Now == nil,
		epoch:     time.Now(),
	}
	s.table = newTable[R](s.opts.MaxKeys)
	if s.opts.Backend != nil {
		s.b = guardBackend(s.opts.Backend)
	}
	s.stopping, s.endStopping = context.WithCancel(context.Background())
	s.closing, s.endClosing = context.WithCancel(context.Background())
	if s.opts.SweepInterval > 0 {
		s.swept = make(chan struct{})
		go s.sweepLoop(s.opts.SweepInterval)
	}
	return s
}

// RunOnce runs fn at most once for key and returns its outcome to every
// caller with that key, until the outcome expires.
//
// The payload identifies the request: a later call with the same key and a
// payload of a different fingerprint gets ErrPayloadMismatch. If the key is
// absent, RunOnce claims it and runs fn. If the key is in flight, RunOnce
// waits for that execution's outcome instead of running fn again. If the key
// holds a final outcome, RunOnce returns it without calling fn.
//
// Only a nil error or one marked with Final is remembered. Any other error,
// and a panic in fn (returned as a *PanicError), releases the key: every
// caller waiting on this execution gets that error, and the next call runs fn
// again.
//
// fn runs under a context that keeps the values of the first caller's ctx but
// not its cancellation, bounded by Options.ExecutionTimeout. Each caller
// waits under its own ctx, for an execution in this process or, through a
// shared Backend, in another: if ctx ends first, RunOnce returns an error
// that matches both ErrInProgress and ctx.Err(), and the execution goes on
// for the others. A ctx that is already done claims nothing.
//
// RunOnce is Begin, then Ticket.Do on a goroutine of its own so that the
// caller may leave; a caller whose ctx can never end runs fn itself.
//
// fn must not call RunOnce with its own key (it would wait for itself until
// ExecutionTimeout, like relocking a sync.Mutex) nor Close the store.
func (s *Store[R]) RunOnce(ctx context.Context, key string, payload any, fn func(context.Context) (R, error)) (R, error) {
	var zero R
	if fn == nil {
		return zero, errNilFunc
	}
	// A caller whose ctx can never end can never stop waiting, so it runs fn
	// itself and pays for neither a goroutine nor a channel.
	var t Ticket[R]
	canLeave := ctx != nil && ctx.Done() != nil
	if err := s.begin(ctx, key, payload, canLeave, false, &t); err != nil {
		return zero, err
	}
	if t.e == nil {
		return t.val, t.err
	}
	if !canLeave {
		if t.work == nil { // a ctx that cannot end needs no detaching
			t.work, t.cancel = s.workContext(t.ctx, nil)
		}
		return t.do(t.work, fn)
	}
	e, r := t.e, t.detach()
	h := &r.t
	if h.work == nil {
		h.work, h.cancel = s.workContext(h.ctx, &h.detached)
	}
	r.fn = fn
	go r.run()
	if err := wait(ctx, e); err != nil {
		return zero, err
	}
	return e.val, e.err
}

// claim claims key in the table. A full table is swept of expired entries
// once before ErrFull is returned, since those entries hold no live key.
func (s *Store[R]) claim(key string, fp Fingerprint, wantDone bool) (*entry[R], claimKind, error) {
	now := s.now()
	unconfirmed := s.opts.Backend != nil
	e, kind, err := s.table.claim(key, fp, now, wantDone, unconfirmed)
	if err == ErrFull {
		if n, _ := s.table.sweep(now, noStop); n > 0 {
			e, kind, err = s.table.claim(key, fp, now, wantDone, unconfirmed)
		}
	}
	return e, kind, err
}

// now is Options.Now, the instant the table judges expiry by. On the system
// clock it is read on its monotonic side alone, one clock read where
// time.Now makes two: every instant the table compares (a claim's, an
// expiry, a sweep's) then carries a monotonic reading, and two such
// instants compare by it alone, as time.Now's do, whatever the wall clock
// does meanwhile. (Its wall reading is the epoch's plus the time since,
// which nothing reads.)
func (s *Store[R]) now() time.Time {
	if s.sysClock {
		return s.epoch.Add(time.Since(s.epoch))
	}
	return s.opts.Now()
}

// Forget drops key's remembered outcome, in memory and in the Backend, so the
// next call with the key runs fn again. It is the operator's reconciliation
// of a key, and the only way to clear an interrupted one. A key in flight,
// here or under a live lease elsewhere, or whose outcome this store is
// still recording, is refused with ErrKeyHeld (which matches
// ErrInProgress); a key not held is not an error. A call of the key here
// waits while Forget is at the Backend, and runs after it.
func (s *Store[R]) Forget(ctx context.Context, key string) error {
	if ctx == nil {
		return errNilContext
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := CheckKey(key); err != nil {
		return err
	}
	if s.closed.Load() {
		return ErrClosed
	}
	if s.opts.Backend == nil {
		return s.table.forget(key)
	}
	// Memory first: a key in flight here, or whose outcome this store is
	// still recording, must not reach the Backend, which may judge its
	// lease lapsed by a clock ahead. Held meanwhile, so that no claim of
	// the key starts here before the Backend has answered. The Backend
	// then refuses a record pending under a live lease elsewhere.
	m, err := s.table.reconcile(key)
	if err != nil {
		return err
	}
	defer s.table.reconciled(m)
	switch err := s.b.Forget(ctx, key, s.opts.Now()); {
	case errors.Is(err, ErrInProgress):
		return fmt.Errorf("%w: %w", ErrKeyHeld, err)
	case err != nil:
		return &BackendError{Op: "forget", Err: err}
	}
	return nil
}

// Sweep removes the outcomes that have expired, from memory and from the
// Backend, and returns how many it removed. The background sweeper calls it
// every Options.SweepInterval; call it yourself when that is negative. Sweep
// holds a lock only for a bounded batch at a time and stops early, with
// ctx's error, if ctx ends.
func (s *Store[R]) Sweep(ctx context.Context) (int, error) {
	if ctx == nil {
		return 0, errNilContext
	}
	if s.closed.Load() {
		return 0, ErrClosed
	}
	return s.sweep(ctx, ctx.Err)
}

// backendSweepBatch bounds the records one Backend.Sweep call deletes, so no
// write transaction runs long.
const backendSweepBatch = 1000

// sweep removes expired outcomes from memory, then from the backend in
// batches, until none are left or stop returns an error.
func (s *Store[R]) sweep(ctx context.Context, stop func() error) (n int, err error) {
	if o := s.opts.Observer; o != nil && o.Sweep != nil {
		defer func() {
			returned := false
			defer guard(&returned, func(v any) { s.observerPanicked("Sweep", v) }, nil)
			o.Sweep(ctx, n, err)
			returned = true
		}()
	}
	return s.sweepAll(ctx, stop)
}

// sweepAll is sweep without the Observer.
func (s *Store[R]) sweepAll(ctx context.Context, stop func() error) (int, error) {
	now := s.opts.Now()
	n, err := s.table.sweep(now, stop)
	if err != nil || s.opts.Backend == nil {
		return n, err
	}
	for {
		if err := stop(); err != nil {
			return n, err
		}
		m, err := s.b.Sweep(ctx, now, backendSweepBatch)
		n += m
		if err != nil {
			return n, &BackendError{Op: "sweep", Err: err}
		}
		if m < backendSweepBatch {
			return n, nil
		}
	}
}

// Len returns the number of keys held in memory, in flight or remembered,
// including expired ones not yet swept.
func (s *Store[R]) Len() int { return s.table.len() }

func noStop() error { return nil }
