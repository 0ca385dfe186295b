package idem

import (
	"context"
	"errors"
	"runtime"
	"runtime/debug"
	"time"

	"github.com/seed094d4201/idem/backend"
)

// A Ticket is one caller's part in a keyed operation, begun by
// [Store.Begin]. Either it holds the operation's remembered outcome
// (Replayed reports it, Result returns it) and there is nothing to do, or
// its caller owns the key: it does the work in its own control flow, under
// Context, and hands the outcome to Finish, which records it (a success,
// or an error marked Final) or releases the key (anything else).
//
// Finish or Release must be called once the work is over, and a deferred
// Release makes sure of it:
//
//	t, err := store.Begin(ctx, key, payload)
//	if err != nil {
//		return err
//	}
//	if t.Replayed() {
//		return use(t.Result())
//	}
//	defer t.Release() // releases the key unless Finish was reached
//	res, err := work(t.Context())
//	res, err = t.Finish(res, err)
//
// A caller that forgets to ask Replayed cannot do the work twice without
// noticing: a replayed ticket's Context is already ended, with
// [ErrReplayed] as its cause, and its Finish records nothing and returns
// ErrReplayed.
//
// While the ticket is open, duplicates in this process wait for its
// outcome, the durable claim's lease is renewed, and Close waits for it. A
// ticket dropped without Finish or Release is released when the garbage
// collector finds it unreachable (its waiters get an error saying so), and
// a durable claim whose owner process is gone lapses with its lease, as
// for RunOnce.
//
// A Ticket is for one goroutine at a time, like the work it stands for:
// Finish and Release must not be called concurrently.
type Ticket[R any] struct {
	s   *Store[R]
	e   *entry[R]       // the key's entry, owned by this ticket; nil for a replay
	ctx context.Context // Begin's: its values go into the work's context

	// The durable claim, if the store has a Backend; nil without one, and
	// for a ticket whose caller keeps the record in a transaction of its
	// own (beginLocal).
	claim *backend.Record
	op    *operation // what Step knows of this execution; in ctx, and so in work

	work   context.Context    // Context's; made on first use, or by Begin for a durable claim
	cancel context.CancelFunc // ends work and its timeout; nil if there is nothing to end, or lease does (endWork)
	// lease is the durable claim's renewals; nil without one. It ends
	// work with the ticket (endWork), and is stopped once the outcome is
	// settled, or handed to the goroutine that goes on recording an
	// outcome the backend refused, by whoever takes it (takeLease).
	lease    *lease[R]
	detached detached // ctx without its cancellation, kept here to save an allocation

	waited   bool        // begin waited for an execution in flight; for the Observer
	replayed bool        // finishReplayed: the owner found the outcome recorded; for the Observer
	start    time.Time   // when an owner's call began; set only with an Observer
	endSpan  func(error) // ends the Observer's "idem.execute" span; nil without one
	begun    bool        // the Observer was told the execution began (Executing +1)

	// run, for a RunOnce caller that may leave, is where its ticket goes
	// when fn is handed to a goroutine; nil otherwise.
	run *detachedRun[R]

	leaseTaken bool // takeLease handed lease's stop on
	finished   bool // set by the first Finish or Release
	settled    bool // settleEntry began: the entry is settled, even if the goroutine ended since
	finalizer  bool // a finalizer is set: Begin and beginLocal's tickets
	val        R    // the replayed outcome, or what Finish returned
	err        error
}

// errReleased is what the waiters of a ticket get when it is released
// without Finish (and without a panic); errAbandoned when it was dropped.
var (
	errReleased    = errors.New("idem: the operation was released before it finished")
	errAbandoned   = errors.New("idem: the operation's Ticket was dropped without Finish or Release")
	errNotFinished = errors.New("idem: the ticket's work has not finished")
)

// Begin starts key's operation in two phases, for callers whose work does
// not fit in a closure: a queue consumer, a handler that streams its
// response. It claims key, or learns its outcome, as RunOnce does, and
// returns a Ticket that says which:
//
//   - The outcome is remembered (Replayed reports true, Result returns
//     it): there is no work to do, as for a replay of RunOnce.
//   - The key was absent: the caller owns it and must do the work, then call
//     Finish with its outcome.
//
// A duplicate in flight in this process is waited for, and so, through a
// shared Backend, is one in flight elsewhere: both waits end when ctx does,
// with an error that matches both ErrInProgress and ctx.Err(). A shared
// execution that failed before commit is returned as Begin's error, as
// RunOnce returns it to the callers that waited on it. The other errors are
// RunOnce's: ErrPayloadMismatch, ErrOutcomeUnknown, ErrInvalidKey, ErrFull,
// ErrClosed, or a *BackendError.
func (s *Store[R]) Begin(ctx context.Context, key string, payload any) (*Ticket[R], error) {
	t := new(Ticket[R])
	if err := s.begin(ctx, key, payload, false, false, t); err != nil {
		return nil, err
	}
	t.open()
	return t, nil
}

// beginLocal is Begin for a caller that keeps key's durable record itself,
// in a transaction that also holds the operation's own writes, such as
// postgres.RunOnceTx: it claims key in this store's memory only, so that
// duplicates in this process wait for Finish instead of for the
// transaction, and neither it nor Finish writes to the Backend. Finish then
// hands the outcome to those duplicates and forgets it; later calls read
// the record the caller committed. The transactional modes reach it
// through the seam in local.go.
func (s *Store[R]) beginLocal(ctx context.Context, key string, payload any) (*Ticket[R], error) {
	t := new(Ticket[R])
	if err := s.begin(ctx, key, payload, false, true, t); err != nil {
		return nil, err
	}
	t.open()
	return t, nil
}

// open readies a ticket that Begin or beginLocal returns: an owner's
// ExecutionTimeout runs from now, and a finalizer releases the key if the
// ticket is dropped unfinished.
func (t *Ticket[R]) open() {
	if t.e == nil {
		return
	}
	if t.work == nil && t.s.opts.ExecutionTimeout > 0 {
		t.Context()
	}
	t.finalizer = true
	runtime.SetFinalizer(t, (*Ticket[R]).abandoned)
}

// Replayed reports whether the ticket holds a remembered outcome: the
// operation finished before, there is nothing to do, and Result returns
// the outcome. It is false when the caller owns the key.
func (t *Ticket[R]) Replayed() bool { return t.e == nil }

// Result returns the ticket's outcome: the remembered one for a replayed
// ticket, and what Finish returned once it has. For an owner's ticket not
// yet finished it returns the zero R and an error saying so.
func (t *Ticket[R]) Result() (R, error) {
	if t.e != nil && !t.finished {
		var zero R
		return zero, errNotFinished
	}
	return t.val, t.err
}

// Context returns the context to do the work under. It keeps the values of
// Begin's ctx but not its cancellation, as RunOnce's fn does: the callers
// waiting on this execution must not fail because the first one left. It
// ends after Options.ExecutionTimeout, when the ticket is finished, and,
// with a Backend, when the store stops trusting the claim's lease
// ([context.Cause] is then ErrLeaseLost): the work should stop, since
// another owner may take the key. For a replayed ticket it has ended
// already, with ErrReplayed as its cause: there is no work to do.
func (t *Ticket[R]) Context() context.Context {
	switch {
	case t.e == nil:
		if t.work == nil {
			var cancel context.CancelCauseFunc
			t.work, cancel = context.WithCancelCause(context.WithoutCancel(t.ctx))
			cancel(ErrReplayed)
		}
	case t.work == nil && t.finished:
		var cancel context.CancelFunc
		t.work, cancel = context.WithCancel(context.WithoutCancel(t.ctx))
		cancel()
	case t.work == nil:
		// Not t.detached: a ticket whose context points into it, through
		// a timeout's context, is a cycle its finalizer would never see
		// collected. RunOnce's tickets, which have no finalizer, use it.
		t.work, t.cancel = t.s.workContext(t.ctx, nil)
		if t.cancel == nil { // no timeout: it must still end with the ticket
			t.work, t.cancel = context.WithCancel(t.work)
		}
	}
	return t.work
}

// Finish ends the operation with the work's outcome and returns what the
// caller should answer: val and err, even if a final outcome could not be
// recorded (see NotRecordedError; the store logs it). A success, or an error marked
// Final, is recorded and replayed to every caller with the key until it
// expires; any other error (a *PanicError included) releases the key, so
// the next call does the work again. Either way the duplicates waiting in
// this process get the outcome. For a ticket already finished, Finish
// changes nothing and returns the outcome it returned before. For a
// replayed ticket it records nothing and returns ErrReplayed: the work
// should not have run.
func (t *Ticket[R]) Finish(val R, err error) (R, error) {
	if t.e == nil {
		var zero R
		return zero, ErrReplayed
	}
	t.dropFinalizer()
	return t.settle(val, err)
}

// settle is Finish without touching the finalizer, so that RunOnce's
// ticket, which has none, can stay on the stack.
func (t *Ticket[R]) settle(val R, err error) (R, error) {
	if t.e == nil || t.finished {
		return t.val, t.err
	}
	if err != nil {
		err = t.checked(err)
	}
	t.finished = true
	t.val, t.err = t.s.finish(t, val, err)
	return t.val, t.err
}

// checked is checkedError for the error t's work ended with. Should one of
// its methods end the goroutine (runtime.Goexit), t is finished on the
// way out as a work that exited is, so that its key is not left in flight
// for a Finish that had dropped its finalizer. Apart from settle so that
// a success carries no deferred call.
func (t *Ticket[R]) checked(err error) error {
	returned := false
	defer exiting(&returned, func() {
		var zero R
		t.finished = true
		t.val, t.err = t.s.finish(t, zero, ErrGoexit)
	})
	err = checkedError(err)
	returned = true
	return err
}

// dropFinalizer removes the finalizer of a ticket about to be finished:
// there will be nothing left to release, so the collector need not call it.
func (t *Ticket[R]) dropFinalizer() {
	if t.finalizer {
		t.finalizer = false
		runtime.SetFinalizer(t, nil)
	}
}

// finishReplayed is Finish for a ticket from beginLocal whose caller found
// the key's outcome already recorded in its own transaction (another
// process committed it): the duplicates waiting here get it, and the
// Observer counts the call as a replay rather than an execution. It is
// for transactional modes such as postgres.RunOnceTx.
func (t *Ticket[R]) finishReplayed(val R, err error) (R, error) {
	if t.e != nil && !t.finished {
		t.replayed = true
	}
	return t.Finish(val, err)
}

// Release releases the key of a ticket that was not finished, so the next
// call does the work again; its waiters get an error saying the operation
// was released. After Finish, and for a replayed ticket, it does nothing.
// It does not recover a panic in the work, so it behaves the same however
// it is deferred: the panic goes on up the caller's stack, and the key is
// released on the way. (Do runs the work and returns a panic in it to
// every waiter as a *PanicError.)
func (t *Ticket[R]) Release() {
	if t.e == nil || t.finished {
		return
	}
	var zero R
	t.Finish(zero, errReleased)
}

// Do runs fn under the ticket's context and finishes the ticket with its
// outcome, a panic in fn returned as a *PanicError. It is what RunOnce
// does with the ticket it owns. For a replayed ticket it returns the
// replay without calling fn.
func (t *Ticket[R]) Do(fn func(context.Context) (R, error)) (R, error) {
	if t.e == nil || t.finished {
		return t.val, t.err
	}
	t.dropFinalizer() // t is held until fn returns
	return t.do(t.Context(), fn)
}

// do is Do under ctx. RunOnce calls it with a context that does not point
// into t, so that t can stay on RunOnce's stack.
func (t *Ticket[R]) do(ctx context.Context, fn func(context.Context) (R, error)) (R, error) {
	var zero R
	if fn == nil {
		return t.settle(zero, errNilFunc)
	}
	defer func() {
		if !t.finished { // fn called runtime.Goexit: it failed before commit
			t.settle(zero, ErrGoexit)
		}
	}()
	val, err, _ := call(ctx, fn)
	return t.settle(val, err)
}

// abandoned is the finalizer of a ticket dropped while it owned its key:
// nothing can finish it any more, so it is released, off the finalizer
// goroutine since a durable release may wait on the backend.
func (t *Ticket[R]) abandoned() {
	if !t.finished && t.s.table.owns(t.e) {
		var zero R
		go t.settle(zero, errAbandoned)
	}
}

// call runs fn. If fn panics, call returns its panic as a *PanicError and
// returned false, whatever the panic value (even an error marked Final, or
// nil under GODEBUG=panicnil=1).
func call[R any](ctx context.Context, fn func(context.Context) (R, error)) (val R, err error, returned bool) {
	panicked := func(v any) {
		var zero R
		val, err = zero, &PanicError{Value: v, Stack: debug.Stack()}
	}
	// A recovered nil (panic(nil) under GODEBUG=panicnil=1) looks like a
	// Goexit to guard; should the goroutine go on, it was a panic.
	defer guard(&returned, panicked, func() { panicked(nil) })
	val, err = fn(ctx)
	return val, err, true
}

// A detachedRun is a RunOnce execution that its caller may leave: the
// ticket its goroutine finishes, the operation its fn's context carries
// and fn, in one allocation. claimKey makes it once the key is claimed for
// such a caller (wantDone), and RunOnce copies the caller's ticket into it.
type detachedRun[R any] struct {
	t  Ticket[R]
	op operation
	fn func(context.Context) (R, error)
}

// run is the detached goroutine: it runs fn and finishes the ticket.
func (r *detachedRun[R]) run() { r.t.do(r.t.work, r.fn) }

// detach returns a copy of t on the heap, for a goroutine to finish while
// t itself stays on its caller's stack: in the detachedRun claimKey made
// for it, which already holds its operation.
func (t *Ticket[R]) detach() *detachedRun[R] {
	r := t.run
	if r == nil {
		r = new(detachedRun[R])
	}
	r.t = *t
	r.t.run = nil
	return r
}

// detached is a context with its parent's values but not its deadline nor
// its cancellation, as context.WithoutCancel makes; a Ticket holds one so
// that a fresh key costs no allocation for it.
type detached struct{ parent context.Context }

func (detached) Deadline() (deadline time.Time, ok bool) { return }
func (detached) Done() <-chan struct{}                   { return nil }
func (detached) Err() error                              { return nil }
func (d detached) Value(key any) any                     { return d.parent.Value(key) }
func (d detached) String() string                        { return "idem.detached" }
