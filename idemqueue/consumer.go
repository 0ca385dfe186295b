package idemqueue

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemqueue/internal/contain"
	"github.com/seed094d4201/idem/internal/txrun"
)

// An Action is what the broker must do with a delivered message.
type Action uint8

const (
	// Ack: the message is done, now or by an earlier delivery.
	Ack Action = iota + 1
	// Reject: the message failed for good; ack it or dead-letter it.
	Reject
	// Retry: deliver the message again, after Decision.Delay.
	Retry
	// Hold: the message cannot be handled as it is: it has no id, or
	// one that is not a valid key, so nothing tells its deliveries
	// apart. Its work did not happen, so it must never be acked: the
	// adapters dead-letter it where the broker can, or else deliver it
	// again after Decision.Delay, for an operator (or a key function a
	// new deploy adds) to take it.
	Hold
)

func (a Action) String() string {
	switch a {
	case Ack:
		return "ack"
	case Reject:
		return "reject"
	case Retry:
		return "retry"
	case Hold:
		return "hold"
	}
	return fmt.Sprintf("Action(%d)", uint8(a))
}

// A Decision is what a Consumer answers for one delivery.
type Decision struct {
	Action Action
	// Delay is how long a Retry, or a Hold the broker cannot dead-letter,
	// waits for its redelivery; zero otherwise.
	Delay time.Duration
	// Replayed reports an Ack or Reject of an outcome an earlier delivery
	// recorded: the handler did not run.
	Replayed bool
	// Err is why, for a Reject, a Retry or a Hold: the handler's error
	// or the store's.
	Err error
}

// Options configure a Consumer. The zero value is ready to use.
type Options struct {
	// RetryDelay is how long a message waits for its redelivery after a
	// failure that the next delivery may not meet: the handler's error or
	// panic (the key was released), a store that could not answer. Zero
	// means one second.
	RetryDelay time.Duration

	// BusyDelay is how long it waits when another delivery of its id
	// runs, in this process or another (ErrInProgress). Zero means
	// RetryDelay.
	BusyDelay time.Duration

	// BusyWait bounds how long Handle waits for another delivery of the
	// same id that runs, here or in another process, before it answers
	// Retry after BusyDelay: a consumer's slot is not held for the whole
	// of another's handler. A TxConsumer's call bounds so its wait for a
	// delivery of the id in flight in this process (TxConsumer.Call).
	// Zero means 5 s; negative means only ctx bounds the wait.
	BusyWait time.Duration

	// InterruptedDelay is how long it waits when an earlier delivery's
	// process stopped in its handler (ErrOutcomeUnknown) and Reconcile is
	// nil: the key is kept for an operator. It is also the Delay of a
	// Hold: a message without a valid id, kept for an operator where the
	// broker cannot dead-letter it. Zero means one minute.
	InterruptedDelay time.Duration

	// Reconcile decides for an interrupted id, whose effect may or may not
	// have happened: it may look at the effect's target, settle the key
	// (Store.Resolve, Store.Forget) and answer Retry with no delay to run
	// or replay it at once, or Ack or Reject the message. err matches
	// idem.ErrOutcomeUnknown. Nil means Retry after InterruptedDelay. A
	// Reconcile that panics is a Retry after InterruptedDelay.
	Reconcile func(ctx context.Context, key string, err error) Decision
}

// A Consumer runs handlers through a Store and decides each delivery. It
// is safe for concurrent use.
type Consumer[R any] struct {
	store *idem.Store[R]
	opts  Options
}

// New returns a Consumer over store. A nil store is an error.
func New[R any](store *idem.Store[R], opts Options) (*Consumer[R], error) {
	if store == nil {
		return nil, errors.New("idemqueue: New with a nil *idem.Store")
	}
	if opts.RetryDelay <= 0 {
		opts.RetryDelay = time.Second
	}
	if opts.BusyDelay <= 0 {
		opts.BusyDelay = opts.RetryDelay
	}
	if opts.BusyWait == 0 {
		opts.BusyWait = 5 * time.Second
	}
	if opts.InterruptedDelay <= 0 {
		opts.InterruptedDelay = time.Minute
	}
	return &Consumer[R]{store: store, opts: opts}, nil
}

// Store returns the Consumer's store.
func (c *Consumer[R]) Store() *idem.Store[R] { return c.store }

// Handle runs fn once for key, the message's id, with payload (the
// message's body, or what identifies it: a redelivery with another payload
// is rejected), and decides. fn runs under the claim's context, which ends
// when the claim's lease is lost (context.Cause is idem.ErrLeaseLost).
//
// What the store refuses before fn runs (another payload under key, an
// invalid key, a payload it cannot fingerprint) is told apart from fn's
// own error by when it came, not by what it wraps: an error fn returns is
// a failure of fn, retried unless it is marked idem.Final, even if it
// wraps idem.ErrPayloadMismatch from a call fn made downstream.
func (c *Consumer[R]) Handle(ctx context.Context, key string, payload any, fn func(context.Context) (R, error)) Decision {
	if ctx == nil {
		return c.decide(context.Background(), key, errors.New("idemqueue: Handle with a nil context"), fromCall)
	}
	wait := ctx // bounds the claim only: the handler's context is the claim's
	if c.opts.BusyWait > 0 {
		var cancel context.CancelFunc
		wait, cancel = context.WithTimeout(ctx, c.opts.BusyWait)
		defer cancel()
	}
	t, err := c.store.Begin(wait, key, payload)
	if err != nil {
		// The store's answer, before any handler ran for this delivery;
		// or the failure of another delivery's handler it waited for,
		// which that handler marked (handlerError).
		return c.decide(ctx, key, err, fromStore)
	}
	if t.Replayed() {
		_, err := t.Result()
		d := c.decide(ctx, key, err, fromHandler) // an outcome recorded before
		d.Replayed = d.Action != Retry
		return d
	}
	// On a goroutine of its own: a handler that calls runtime.Goexit
	// (t.FailNow) must not end the broker's delivery goroutine too,
	// leaving the message unsettled.
	_, err = contain.Call(func() (R, error) { return t.Do(marked(fn)) })
	return c.decide(ctx, key, err, fromHandler)
}

// HandleTx is Handle for a handler that makes its own call through the
// Consumer's store under key: a RunOnceTx of sqlite, bolt, postgres or
// mysql, whose writes commit with the key and its outcome (or a RunOnce). call
// returns that call's error, which decides. Decision.Replayed reports that
// a RunOnceTx call made for key, under the ctx it was given, answered with
// the outcome an earlier delivery recorded rather than by running its fn;
// a RunOnce's replay is not seen (Handle sees its own).
//
// That error may be the store's refusal or the handler's own, and both
// may wrap the same sentinel, so a refusal is judged by the store's
// state, not by the error: an idem.ErrInvalidKey by idem.CheckKey of key,
// an idem.ErrInvalidPayload by fingerprinting payload with the store's
// Fingerprint, an idem.ErrPayloadMismatch by the key's record in the
// store's Backend holding another payload's fingerprint; and an
// idem.ErrOutcomeUnknown, before Reconcile is asked, by that record being
// claimed and not completed. An error that matches one but is not borne
// out is the handler's failure, retried (a store without a Backend
// cannot show its record: its mismatches are retried too, until the
// first payload's outcome expires).
func (c *Consumer[R]) HandleTx(ctx context.Context, key string, payload any, call func(ctx context.Context, key string, payload any) error) Decision {
	if ctx == nil || call == nil {
		return c.decide(context.Background(), key, errors.New("idemqueue: HandleTx with a nil context or call"), fromCall)
	}
	if err := idem.CheckKey(key); err != nil { // the store's first refusal, made here: nothing to call
		return c.decide(ctx, key, err, fromStore)
	}
	// A panic or a Goexit in call is a failure: retried, as under Handle.
	// The RunOnceTx that call makes under ctx for key notes whether it
	// answered with an outcome recorded before, which its result does not say.
	noted, replayed := txrun.NoteReplays(ctx, key)
	_, err := contain.Call(func() (struct{}, error) { return struct{}{}, call(noted, key, payload) })
	from := fromCall
	switch {
	case c.refusedByStore(ctx, key, payload, err):
		from = fromStore
	case errors.Is(err, idem.ErrOutcomeUnknown) && !c.interruptedInStore(ctx, key):
		// Not the store's: a call the handler made was interrupted. Its
		// transaction rolled back, and Reconcile, which may settle the
		// key, must not be told it was interrupted.
		from = fromHandler
	}
	d := c.decide(ctx, key, err, from)
	// As under Handle: a replayed outcome that decides the message.
	d.Replayed = replayed() && (d.Action == Ack || d.Action == Reject)
	return d
}

// Decide turns the error of a call that ran a message's handler through
// the Consumer's store under key (RunOnce, or a RunOnceTx of sqlite, bolt,
// postgres or mysql) into a Decision, as the package doc's table says. It does
// not know whether the call replayed an earlier outcome, nor whether the
// store or the handler made err, and it is not given the payload: it
// holds a message as unkeyed (Hold) only if key is not a valid key, and
// takes no error for the store's refusal of the payload (another payload
// under key, one it cannot fingerprint), which it retries. HandleTx,
// given the payload, tells them apart.
func (c *Consumer[R]) Decide(ctx context.Context, key string, err error) Decision {
	return c.decide(ctx, key, err, fromCall)
}

// An origin is where an error came from, which decides what it means.
type origin uint8

const (
	// fromStore: the store answered before any handler ran for this
	// delivery (Begin), or a refusal HandleTx verified.
	fromStore origin = iota + 1
	// fromHandler: the handler's outcome (Ticket.Do), or one recorded
	// before (a replay).
	fromHandler
	// fromCall: a call that did both (RunOnce, RunOnceTx), unverified.
	fromCall
)

// decide is the package doc's table: the one place an error becomes a
// Decision. An error that matches idem.ErrPayloadMismatch or
// idem.ErrInvalidPayload is the store's refusal of the message (Reject)
// only when it came from the store; from a handler, whatever it wraps, it
// is a failure of that handler, which the store did not record: retried.
func (c *Consumer[R]) decide(ctx context.Context, key string, err error, from origin) Decision {
	var panicked *idem.PanicError
	var failed *handlerError
	switch {
	case err == nil:
		return Decision{Action: Ack}
	case errors.Is(err, idem.ErrInvalidKey) && idem.CheckKey(key) != nil:
		// No valid id: the key itself shows the store refused it, and
		// every delivery would meet the same refusal. Not an ack: the
		// message's work did not happen.
		return Decision{Action: Hold, Delay: c.opts.InterruptedDelay, Err: err}
	case errors.As(err, &panicked):
		// A panic failed before commit, whatever its value (even an
		// error marked Final): the store released the key, as it does
		// for any panic, so the message must run again.
		return Decision{Action: Retry, Delay: c.opts.RetryDelay, Err: err}
	case idem.IsFinal(err):
		return Decision{Action: Reject, Err: err}
	case errors.As(err, &failed):
		// A handler's failure: this delivery's, or that of another
		// delivery of the id, which this one waited for in Begin.
		return Decision{Action: Retry, Delay: c.opts.RetryDelay, Err: failed.err}
	case from == fromHandler:
		// Not final: the store released the key, whatever err wraps.
		return Decision{Action: Retry, Delay: c.opts.RetryDelay, Err: err}
	case from == fromStore && (errors.Is(err, idem.ErrPayloadMismatch) || errors.Is(err, idem.ErrInvalidPayload)):
		return Decision{Action: Reject, Err: err}
	case errors.Is(err, idem.ErrOutcomeUnknown):
		return c.reconcile(ctx, key, err)
	case errors.Is(err, idem.ErrInProgress):
		return Decision{Action: Retry, Delay: c.opts.BusyDelay, Err: err}
	}
	return Decision{Action: Retry, Delay: c.opts.RetryDelay, Err: err}
}

// A handlerError is a handler's failure, not final, on its way through
// the store: the store hands it to the deliveries of the same id that
// waited for that handler, and decide must not take it for the store's
// refusal of theirs. It reads and unwraps as the handler's error.
type handlerError struct{ err error }

func (e *handlerError) Error() string { return e.err.Error() }
func (e *handlerError) Unwrap() error { return e.err }

// marked returns fn with its errors that are not final marked as the
// handler's. A final error is recorded as it is, unmarked.
func marked[R any](fn func(context.Context) (R, error)) func(context.Context) (R, error) {
	if fn == nil {
		return nil // Ticket.Do's own error
	}
	return func(ctx context.Context) (R, error) {
		val, err := fn(ctx)
		if err != nil && !idem.IsFinal(err) {
			err = &handlerError{err}
		}
		return val, err
	}
}

// refusedByStore reports whether err, from a call that ran the handler
// through the store itself, is the store's refusal of payload, as the
// store's state bears out (HandleTx says how).
func (c *Consumer[R]) refusedByStore(ctx context.Context, key string, payload any, err error) bool {
	if err == nil || !errors.Is(err, idem.ErrInvalidPayload) && !errors.Is(err, idem.ErrPayloadMismatch) {
		return false // an invalid key is checked before the call
	}
	opts := txrun.Of(c.store).Options()
	// The store's own Fingerprint and Backend: the user's code, contained.
	// A Fingerprint that fails, panics included, is what the store calls
	// an invalid payload.
	fp, ferr := contain.Call(func() (idem.Fingerprint, error) { return opts.Fingerprint(payload) })
	switch {
	case errors.Is(err, idem.ErrInvalidPayload):
		return ferr != nil
	case ferr != nil || opts.Backend == nil:
		return false
	}
	rec, ok := c.record(ctx, key)
	return ok && rec.Fingerprint != fp
}

// interruptedInStore reports whether key's record in the store's Backend
// is claimed, not completed: what an idem.ErrOutcomeUnknown of the store
// stands on. A store without a Backend cannot show it.
func (c *Consumer[R]) interruptedInStore(ctx context.Context, key string) bool {
	rec, ok := c.record(ctx, key)
	return ok && rec.State != backend.StateCompleted
}

// record reads key's record from the store's Backend, the user's code,
// contained. It reports false if there is none, no Backend, or the read
// failed.
func (c *Consumer[R]) record(ctx context.Context, key string) (backend.Record, bool) {
	opts := txrun.Of(c.store).Options()
	if opts.Backend == nil {
		return backend.Record{}, false
	}
	type found struct {
		rec backend.Record
		ok  bool
	}
	f, err := contain.Call(func() (found, error) {
		rec, ok, err := opts.Backend.Get(ctx, key, opts.Now())
		return found{rec, ok}, err
	})
	return f.rec, err == nil && f.ok
}

// reconcile asks Options.Reconcile about an interrupted key.
func (c *Consumer[R]) reconcile(ctx context.Context, key string, err error) Decision {
	keep := Decision{Action: Retry, Delay: c.opts.InterruptedDelay, Err: err}
	if c.opts.Reconcile == nil {
		return keep
	}
	d, herr := contain.Call(func() (Decision, error) { return c.opts.Reconcile(ctx, key, err), nil })
	if herr != nil {
		keep.Err = fmt.Errorf("%w (and Reconcile did not return: %w)", err, herr)
		return keep
	}
	switch d.Action {
	case Ack, Reject:
		d.Delay = 0
	case Retry:
		d.Delay = max(d.Delay, 0)
	default:
		keep.Err = fmt.Errorf("%w (and Reconcile answered %v)", err, d.Action)
		return keep
	}
	return d
}
