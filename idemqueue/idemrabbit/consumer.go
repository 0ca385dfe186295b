package idemrabbit

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemqueue"
)

// Options configure a Consumer. Queue is required; the zero value of every
// other field is ready to use.
type Options struct {
	// Queue is the queue consumed.
	Queue string

	// Prefetch is how many unacked deliveries the broker sends at once
	// (basic.qos), and how many handlers run at once. Zero means 16.
	Prefetch int

	// Key returns a delivery's idempotency key. Nil means its MessageId;
	// a delivery without one is rejected, since nothing tells its
	// redeliveries apart from new messages.
	Key func(amqp.Delivery) (string, error)

	// Payload returns what a message's deliveries must agree on (another
	// payload under the same key is rejected). Nil means its body.
	Payload func(amqp.Delivery) any

	// DeadLetter nacks a rejected delivery without requeue, for the
	// queue's dead-letter exchange, instead of acking it. With Declare,
	// the queue is declared with a dead-letter queue, <queue>.dead.
	DeadLetter bool

	// Declare declares the queue (durable) when Run connects. False means
	// the queue must exist. The retry queues are declared either way.
	Declare bool

	// Report, if not nil, is told of each delivery's decision and of the
	// error settling it, if any. It runs on the handler's goroutine.
	Report func(amqp.Delivery, idemqueue.Decision, error)
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
	if opts.Prefetch <= 0 {
		opts.Prefetch = 16
	}
	return &Consumer[R]{q: q, opts: opts}, nil
}

// errNoID is why a delivery without a key is rejected.
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
	if key, err := c.key(d); err != nil {
		dec = c.q.Decide(ctx, key, err)
	} else {
		dec = decide(ctx, key, c.payload(d))
	}
	var err error
	switch dec.Action {
	case idemqueue.Ack:
		err = s.ack(d)
	case idemqueue.Reject:
		err = s.reject(d, c.opts.DeadLetter)
	default:
		err = s.retry(ctx, d, dec.Delay)
	}
	if err != nil {
		err = fmt.Errorf("idemrabbit: settling the delivery (%v): %w", dec.Action, err)
	}
	if c.opts.Report != nil {
		c.opts.Report(d, dec, err)
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
		return c.q.Decide(ctx, key, callGuarded(ctx, key, payload, call))
	}
}

// callGuarded runs call, turning a panic into an error: the delivery is
// then retried, as for a handler's panic.
func callGuarded(ctx context.Context, key string, payload any, call func(context.Context, string, any) error) (err error) {
	returned := false
	defer func() {
		if v := recover(); v != nil || !returned {
			err = &idem.PanicError{Value: v, Stack: debug.Stack()}
		}
	}()
	err = call(ctx, key, payload)
	returned = true
	return err
}

// key is d's key, from Options.Key or its MessageId.
func (c *Consumer[R]) key(d amqp.Delivery) (key string, err error) {
	if c.opts.Key == nil {
		if d.MessageId == "" {
			return "", errNoID
		}
		return d.MessageId, nil
	}
	defer func() {
		if v := recover(); v != nil {
			key, err = "", fmt.Errorf("%w: Options.Key panicked: %v", idem.ErrInvalidKey, v)
		}
	}()
	if key, err = c.opts.Key(d); err != nil {
		return "", fmt.Errorf("%w: Options.Key: %w", idem.ErrInvalidKey, err)
	}
	return key, nil
}

// payload is what d's redeliveries must agree on.
func (c *Consumer[R]) payload(d amqp.Delivery) any {
	if c.opts.Payload == nil {
		return d.Body
	}
	return c.opts.Payload(d)
}
