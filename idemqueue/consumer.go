package idemqueue

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemqueue/internal/contain"
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
)

func (a Action) String() string {
	switch a {
	case Ack:
		return "ack"
	case Reject:
		return "reject"
	case Retry:
		return "retry"
	}
	return fmt.Sprintf("Action(%d)", uint8(a))
}

// A Decision is what a Consumer answers for one delivery.
type Decision struct {
	Action Action
	// Delay is how long a Retry waits for its redelivery; zero otherwise.
	Delay time.Duration
	// Replayed reports an Ack or Reject of an outcome an earlier delivery
	// recorded: the handler did not run.
	Replayed bool
	// Err is why, for a Reject or a Retry: the handler's error or the
	// store's.
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
	// of another's handler. Zero means 5 s; negative means only ctx
	// bounds the wait.
	BusyWait time.Duration

	// InterruptedDelay is how long it waits when an earlier delivery's
	// process stopped in its handler (ErrOutcomeUnknown) and Reconcile is
	// nil: the key is kept for an operator. Zero means one minute.
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
func (c *Consumer[R]) Handle(ctx context.Context, key string, payload any, fn func(context.Context) (R, error)) Decision {
	if ctx == nil {
		return c.Decide(context.Background(), key, errors.New("idemqueue: Handle with a nil context"))
	}
	wait := ctx // bounds the claim only: the handler's context is the claim's
	if c.opts.BusyWait > 0 {
		var cancel context.CancelFunc
		wait, cancel = context.WithTimeout(ctx, c.opts.BusyWait)
		defer cancel()
	}
	t, err := c.store.Begin(wait, key, payload)
	if err != nil {
		return c.Decide(ctx, key, err)
	}
	if t.Replayed() {
		_, err := t.Result()
		d := c.Decide(ctx, key, err)
		d.Replayed = d.Action != Retry
		return d
	}
	// On a goroutine of its own: a handler that calls runtime.Goexit
	// (t.FailNow) must not end the broker's delivery goroutine too,
	// leaving the message unsettled.
	_, err = contain.Call(func() (R, error) { return t.Do(fn) })
	return c.Decide(ctx, key, err)
}

// Decide turns the error of a call that ran a message's handler through
// the Consumer's store under key (RunOnce, or a RunOnceTx of sqlite, bolt
// or postgres) into a Decision, as the package doc's table says. It does
// not know whether the call replayed an earlier outcome.
func (c *Consumer[R]) Decide(ctx context.Context, key string, err error) Decision {
	var panicked *idem.PanicError
	switch {
	case err == nil:
		return Decision{Action: Ack}
	case errors.As(err, &panicked):
		// A panic failed before commit, whatever its value (even an
		// error marked Final): the store released the key, as it does
		// for any panic, so the message must run again.
		return Decision{Action: Retry, Delay: c.opts.RetryDelay, Err: err}
	case idem.IsFinal(err):
		return Decision{Action: Reject, Err: err}
	case errors.Is(err, idem.ErrPayloadMismatch), errors.Is(err, idem.ErrInvalidKey), errors.Is(err, idem.ErrInvalidPayload):
		return Decision{Action: Reject, Err: err}
	case errors.Is(err, idem.ErrOutcomeUnknown):
		return c.reconcile(ctx, key, err)
	case errors.Is(err, idem.ErrInProgress):
		return Decision{Action: Retry, Delay: c.opts.BusyDelay, Err: err}
	}
	return Decision{Action: Retry, Delay: c.opts.RetryDelay, Err: err}
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
