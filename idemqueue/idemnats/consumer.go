package idemnats

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemqueue"
	"github.com/seed094d4201/idem/idemqueue/internal/contain"
)

// Options configure a Consumer. The zero value is ready to use.
type Options struct {
	// Key returns a message's idempotency key. Nil means its Nats-Msg-Id
	// header. A message without a valid key (no header, or Key's error)
	// is held (idemqueue.Hold), since nothing tells its redeliveries
	// apart from new messages: naked, and redelivered after
	// idemqueue.Options.InterruptedDelay, never acked nor terminated. A Key that falls back on a field of the body when
	// the header is missing handles such messages instead.
	Key func(jetstream.Msg) (string, error)

	// Payload returns what a message's redeliveries must agree on (its
	// fingerprint is kept with the key: another payload under the same
	// key is rejected). Nil means the message's data.
	Payload func(jetstream.Msg) any

	// AckRejected acks a message the decision rejects (a final failure,
	// another payload under its key) instead of terminating it. False
	// means Term, which JetStream reports as an advisory
	// ($JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED), for a dead-letter
	// stream to collect (on a work-queue or interest stream, a term
	// deletes the message as an ack does: the advisory names its
	// sequence, not its data). A held message (no valid id) is naked
	// either way: its work did not happen.
	AckRejected bool

	// ProgressInterval is how often a message being handled is marked
	// InProgress. Zero means 5 s, a sixth of JetStream's default AckWait;
	// set it below the consumer's AckWait. Negative means never.
	ProgressInterval time.Duration

	// Consumer configures the idemqueue.Consumer that NewTx makes (its
	// delays, BusyWait, Reconcile). New, given a Consumer, ignores it.
	Consumer idemqueue.Options
}

// A Consumer handles JetStream messages through an idemqueue.Consumer and
// settles them. It is safe for concurrent use.
type Consumer[R any] struct {
	q    *idemqueue.Consumer[R]
	opts Options
}

// New returns a Consumer over q. A nil q is an error.
func New[R any](q *idemqueue.Consumer[R], opts Options) (*Consumer[R], error) {
	if q == nil {
		return nil, errors.New("idemnats: New with a nil *idemqueue.Consumer")
	}
	if opts.ProgressInterval == 0 {
		opts.ProgressInterval = 5 * time.Second
	}
	return &Consumer[R]{q: q, opts: opts}, nil
}

// errNoID is why a message without a key is held.
var errNoID = fmt.Errorf("%w: the message has no %s header", idem.ErrInvalidKey, jetstream.MsgIDHeader)

// Handle runs fn for msg through the store, once for its key, and settles
// msg as the decision says. It returns the decision and the error of
// settling msg, if any (the broker then redelivers it after AckWait, and
// the redelivery replays). fn runs under the claim's context, which ends
// when the claim's lease is lost. A nil msg or fn is refused: nothing is
// run or settled, and the error says why.
func (c *Consumer[R]) Handle(ctx context.Context, msg jetstream.Msg, fn func(context.Context, jetstream.Msg) (R, error)) (idemqueue.Decision, error) {
	if msg == nil || fn == nil || ctx == nil {
		return idemqueue.Decision{}, errors.New("idemnats: Handle with a nil context, message or handler")
	}
	key, payload, err := c.identify(msg)
	if err != nil {
		d := c.q.Decide(ctx, key, err)
		return d, c.settle(msg, d)
	}
	p := c.progress(msg)
	defer p.stop()
	d := c.q.Handle(ctx, key, payload, func(ctx context.Context) (R, error) {
		defer p.follow(ctx)()
		return fn(ctx, msg)
	})
	p.stop()
	return d, c.settle(msg, d)
}

// HandleTx is Handle for a handler that makes its own call through the
// Consumer's store under key: a RunOnceTx of sqlite, bolt, postgres or
// mysql, whose writes commit with the key and its outcome. call returns that
// call's error, which decides as idemqueue.Consumer.HandleTx says.
func (c *Consumer[R]) HandleTx(ctx context.Context, msg jetstream.Msg, call func(ctx context.Context, key string, payload any) error) (idemqueue.Decision, error) {
	if msg == nil || call == nil || ctx == nil {
		return idemqueue.Decision{}, errors.New("idemnats: HandleTx with a nil context, message or call")
	}
	key, payload, err := c.identify(msg)
	if err != nil {
		d := c.q.Decide(ctx, key, err)
		return d, c.settle(msg, d)
	}
	p := c.progress(msg)
	defer p.stop()
	d := c.q.HandleTx(ctx, key, payload, call)
	p.stop()
	return d, c.settle(msg, d)
}

// MessageHandler returns a jetstream.MessageHandler, for Consume, that
// handles each message with fn under ctx. report, if not nil, is told of
// each message's decision and of an error settling it. Consume calls it
// for one message at a time: for several in flight, hand the messages
// to workers that call Handle (bench/consumer_test.go runs 16 so), with
// the consumer's MaxAckPending at least their number.
func (c *Consumer[R]) MessageHandler(ctx context.Context, fn func(context.Context, jetstream.Msg) (R, error), report func(jetstream.Msg, idemqueue.Decision, error)) jetstream.MessageHandler {
	return func(msg jetstream.Msg) {
		d, err := c.Handle(ctx, msg, fn)
		if report != nil {
			report(msg, d, err)
		}
	}
}

// identify returns msg's key, from Options.Key or its Nats-Msg-Id header,
// and its payload. A key function's error holds the message; a panic in
// Options.Key or Options.Payload (a bug, which a fixed deploy may not
// have) retries it.
func (c *Consumer[R]) identify(msg jetstream.Msg) (key string, payload any, err error) {
	if c.opts.Key == nil {
		if key = msg.Headers().Get(jetstream.MsgIDHeader); key == "" {
			return "", nil, errNoID
		}
	} else {
		var kerr error
		key, err = contain.Call(func() (string, error) {
			k, err := c.opts.Key(msg)
			kerr = err
			return k, err
		})
		switch {
		case kerr != nil:
			return "", nil, fmt.Errorf("%w: Options.Key: %w", idem.ErrInvalidKey, kerr)
		case err != nil:
			return "", nil, fmt.Errorf("idemnats: Options.Key: %w", err)
		}
	}
	if c.opts.Payload == nil {
		return key, msg.Data(), nil
	}
	payload, err = contain.Call(func() (any, error) { return c.opts.Payload(msg), nil })
	if err != nil {
		return key, nil, fmt.Errorf("idemnats: Options.Payload: %w", err)
	}
	return key, payload, nil
}

// settle does what d says with msg.
func (c *Consumer[R]) settle(msg jetstream.Msg, d idemqueue.Decision) error {
	var err error
	switch d.Action {
	case idemqueue.Ack:
		err = msg.Ack()
	case idemqueue.Reject:
		if c.opts.AckRejected {
			err = msg.Ack()
		} else {
			// Not TermWithReason: servers before 2.10.4 ignore a
			// term with a reason, and redeliver the message. The
			// reason is in d.Err, for the caller.
			err = msg.Term()
		}
	case idemqueue.Hold:
		// Never acked, nor terminated, even with AckRejected: its work
		// did not happen, and a term deletes the message from a
		// work-queue or interest stream as an ack does (only the
		// advisory would be left, without the message). Naked, it stays
		// in the stream, delivered again after d.Delay for an operator.
		err = msg.NakWithDelay(d.Delay)
	default:
		err = msg.NakWithDelay(d.Delay)
	}
	if err != nil {
		return fmt.Errorf("idemnats: settling the message (%v): %w", d.Action, err)
	}
	return nil
}
