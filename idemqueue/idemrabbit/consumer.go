package idemrabbit

import (
	"context"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemqueue"
	"github.com/seed094d4201/idem/idemqueue/internal/contain"
)

// Options configure a Consumer. Queue is required; the zero value of every
// other field is ready to use.
type Options struct {
	// Queue is the queue consumed.
	Queue string

	// Prefetch is how many unacked deliveries the broker sends at once
	// (basic.qos), and how many handlers run at once. Zero means 16.
	Prefetch int

	// Key returns a delivery's idempotency key. Nil means its MessageId.
	// A delivery without a valid key (no MessageId, or Key's error) is
	// held (idemqueue.Hold), since nothing tells its redeliveries apart
	// from new messages: dead-lettered with DeadLetter, or else
	// retried after idemqueue.Options.InterruptedDelay, never acked. A
	// Key that falls back on a field of the body when MessageId is
	// missing handles such deliveries instead.
	Key func(amqp.Delivery) (string, error)

	// Payload returns what a message's deliveries must agree on (another
	// payload under the same key is rejected). Nil means its body.
	Payload func(amqp.Delivery) any

	// DeadLetter nacks a rejected or held delivery without requeue, for
	// the queue's dead-letter exchange, instead of acking a rejected one
	// and retrying a held one later. With Declare, the queue is declared
	// with a dead-letter queue, <queue>.dead; without it, the queue must
	// have a dead-letter exchange, or RabbitMQ drops what is nacked.
	DeadLetter bool

	// Declare declares the queue (durable) when Run connects. False means
	// the queue must exist. The retry queues are declared either way.
	Declare bool

	// Report, if not nil, is told of each delivery's decision and of the
	// error settling it, if any. It runs on the handler's goroutine.
	Report func(amqp.Delivery, idemqueue.Decision, error)

	// Consumer configures the idemqueue.Consumer that NewTx makes (its
	// delays, BusyWait, Reconcile). New, given a Consumer, ignores it.
	Consumer idemqueue.Options
}

// A Consumer consumes a RabbitMQ queue through an idemqueue.Consumer.
type Consumer[R any] struct {
	q    *idemqueue.Consumer[R]
	opts Options
}

// New returns a Consumer over q. A nil q or an empty Options.Queue is an
// error.
func New[R any](q *idemqueue.Consumer[R], opts Options) (*Consumer[R], error) {
	if q == nil {
		return nil, errors.New("idemrabbit: New with a nil *idemqueue.Consumer")
	}
	if opts.Queue == "" {
		return nil, errors.New("idemrabbit: New without Options.Queue")
	}
	switch {
	case opts.Prefetch <= 0:
		opts.Prefetch = 16
	case opts.Prefetch > 65535:
		return nil, fmt.Errorf("idemrabbit: Options.Prefetch %d: AMQP's prefetch count is at most 65535", opts.Prefetch)
	}
	// The longest name made of it, a retry queue's, must be a legal one.
	if n := len(retryQueue(opts.Queue, maxDelay.Milliseconds())); n > 255 {
		return nil, fmt.Errorf("idemrabbit: Options.Queue %q: its retry queues' names would pass AMQP's 255 bytes", opts.Queue)
	}
	return &Consumer[R]{q: q, opts: opts}, nil
}

// errNoID is why a delivery without a key is held.
var errNoID = fmt.Errorf("%w: the message has no MessageId", idem.ErrInvalidKey)

// A settler settles one delivery: a session's, or a test's.
type settler interface {
	ack(d amqp.Delivery) error
	reject(d amqp.Delivery, deadLetter bool) error
	retry(ctx context.Context, d amqp.Delivery, delay time.Duration) error
}

// handle decides d with decide, given its key and payload, and settles it.
func (c *Consumer[R]) handle(ctx context.Context, s settler, d amqp.Delivery, decide func(ctx context.Context, key string, payload any) idemqueue.Decision) (idemqueue.Decision, error) {
	var dec idemqueue.Decision
	if key, payload, err := c.identify(d); err != nil {
		dec = c.q.Decide(ctx, key, err)
	} else {
		dec = decide(ctx, key, payload)
	}
	var err error
	switch dec.Action {
	case idemqueue.Ack:
		err = s.ack(d)
	case idemqueue.Reject:
		err = s.reject(d, c.opts.DeadLetter)
	case idemqueue.Hold:
		// Never acked: its work did not happen. The dead-letter
		// exchange takes it, or, without one, it waits in a retry
		// queue and comes back after dec.Delay, for an operator.
		if c.opts.DeadLetter {
			err = s.reject(d, true)
		} else {
			err = s.retry(ctx, d, dec.Delay)
		}
	default:
		err = s.retry(ctx, d, dec.Delay)
	}
	if err != nil {
		err = fmt.Errorf("idemrabbit: settling the delivery (%v): %w", dec.Action, err)
	}
	if c.opts.Report != nil {
		_, _ = contain.Call(func() (struct{}, error) { c.opts.Report(d, dec, err); return struct{}{}, nil })
	}
	return dec, err
}

// handler returns the decide func of a handler fn.
func (c *Consumer[R]) handler(d amqp.Delivery, fn func(context.Context, amqp.Delivery) (R, error)) func(context.Context, string, any) idemqueue.Decision {
	return func(ctx context.Context, key string, payload any) idemqueue.Decision {
		return c.q.Handle(ctx, key, payload, func(ctx context.Context) (R, error) { return fn(ctx, d) })
	}
}

// caller returns the decide func of a call that runs the handler through
// the store itself (a RunOnceTx).
func (c *Consumer[R]) caller(call func(context.Context, string, any) error) func(context.Context, string, any) idemqueue.Decision {
	return func(ctx context.Context, key string, payload any) idemqueue.Decision {
		return c.q.HandleTx(ctx, key, payload, call)
	}
}

// identify returns d's key, from Options.Key or its MessageId, and its
// payload. A key function's error holds the delivery; a panic in
// Options.Key or Options.Payload (a bug, which a fixed deploy may not
// have) retries it.
func (c *Consumer[R]) identify(d amqp.Delivery) (key string, payload any, err error) {
	if c.opts.Key == nil {
		if key = d.MessageId; key == "" {
			return "", nil, errNoID
		}
	} else {
		var kerr error
		key, err = contain.Call(func() (string, error) {
			k, err := c.opts.Key(d)
			kerr = err
			return k, err
		})
		switch {
		case kerr != nil:
			return "", nil, fmt.Errorf("%w: Options.Key: %w", idem.ErrInvalidKey, kerr)
		case err != nil:
			return "", nil, fmt.Errorf("idemrabbit: Options.Key: %w", err)
		}
	}
	if c.opts.Payload == nil {
		return key, d.Body, nil
	}
	payload, err = contain.Call(func() (any, error) { return c.opts.Payload(d), nil })
	if err != nil {
		return key, nil, fmt.Errorf("idemrabbit: Options.Payload: %w", err)
	}
	return key, payload, nil
}
