package idemrabbit

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/seed094d4201/idem/idemqueue"
)

// Run consumes Options.Queue over connections from dial, handling each
// delivery with fn, until ctx ends; it then stops consuming, waits for the
// handlers running, closes its connection and returns ctx's error, which
// also says how the last session ended. A connection or channel that
// closes is dialed again, after a pause that grows from 100 ms to 5 s
// while dialing fails or sessions end at once, so Run outlasts a broker
// that goes away and comes back. A refusal no new connection can change
// ends Run with an error at once: access refused (403), the queue absent
// without Declare (404), the queue declared with other arguments (406). A
// nil ctx, dial or fn is an error.
func (c *Consumer[R]) Run(ctx context.Context, dial func(context.Context) (*amqp.Connection, error), fn func(context.Context, amqp.Delivery) (R, error)) error {
	if ctx == nil || dial == nil || fn == nil {
		return errors.New("idemrabbit: Run with a nil context, dial or handler")
	}
	return c.run(ctx, dial, func(d amqp.Delivery) func(context.Context, string, any) idemqueue.Decision {
		return c.handler(d, fn)
	})
}

// RunTx is Run for a handler that makes its own call through the
// Consumer's store under key: a RunOnceTx of sqlite, bolt, postgres or
// mysql, whose writes commit with the key and its outcome. call returns that
// call's error, which decides.
func (c *Consumer[R]) RunTx(ctx context.Context, dial func(context.Context) (*amqp.Connection, error), call func(ctx context.Context, key string, payload any) error) error {
	if ctx == nil || dial == nil || call == nil {
		return errors.New("idemrabbit: RunTx with a nil context, dial or call")
	}
	decide := c.caller(call)
	return c.run(ctx, dial, func(amqp.Delivery) func(context.Context, string, any) idemqueue.Decision { return decide })
}

// run is Run and RunTx.
func (c *Consumer[R]) run(ctx context.Context, dial func(context.Context) (*amqp.Connection, error), decider func(amqp.Delivery) func(context.Context, string, any) idemqueue.Decision) error {
	pause := 100 * time.Millisecond
	var last error
	for {
		began := time.Now()
		err := c.session(ctx, dial, decider)
		if errors.Is(err, errRefused) {
			return err
		}
		if ctx.Err() != nil {
			if last != nil {
				return fmt.Errorf("%w (the last session ended with: %w)", ctx.Err(), last)
			}
			return ctx.Err()
		}
		if err != nil {
			last = err
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			continue
		case <-t.C:
		}
		if errors.Is(err, errDial) || time.Since(began) < time.Second {
			pause = min(2*pause, 5*time.Second)
		} else {
			pause = 100 * time.Millisecond
		}
	}
}

// errDial marks a session that never began; errRefused one the broker
// refused in a way no new connection changes.
var (
	errDial    = errors.New("idemrabbit: dialing")
	errRefused = errors.New("idemrabbit: refused")
)

// setupErr is how a session's setup failed: refused for good, or worth
// dialing again.
func setupErr(err error) error {
	var ae *amqp.Error
	if errors.As(err, &ae) && (ae.Code == amqp.AccessRefused || ae.Code == amqp.NotFound || ae.Code == amqp.PreconditionFailed) {
		return fmt.Errorf("%w: %w", errRefused, err)
	}
	return fmt.Errorf("%w: %w", errDial, err)
}

// session consumes over one connection until it closes or ctx ends.
func (c *Consumer[R]) session(ctx context.Context, dial func(context.Context) (*amqp.Connection, error), decider func(amqp.Delivery) func(context.Context, string, any) idemqueue.Decision) error {
	conn, err := dial(ctx)
	if err != nil {
		return fmt.Errorf("%w: %w", errDial, err)
	}
	defer conn.Close()
	s, err := open(conn, c.opts)
	if err != nil {
		return setupErr(err)
	}
	closed := s.consume.NotifyClose(make(chan *amqp.Error, 1))
	pubClosed := s.publish.NotifyClose(make(chan *amqp.Error, 1))
	deliveries, err := s.consume.ConsumeWithContext(ctx, c.opts.Queue, "", false, false, false, false, nil)
	if err != nil {
		return setupErr(fmt.Errorf("consuming %s: %w", c.opts.Queue, err))
	}
	var wg sync.WaitGroup
	defer wg.Wait()      // before the connection closes: their settles go out
	defer close(s.ended) // first: a handler waiting to put its delivery back stops waiting
	slots := make(chan struct{}, c.opts.Prefetch)
	for {
		select {
		case <-ctx.Done():
			return nil
		case e := <-closed:
			return closeErr(e)
		case e := <-pubClosed:
			return closeErr(e)
		case d, ok := <-deliveries:
			if !ok {
				return errClosed
			}
			d = restored(d, s.user) // for the handler too, which decider(d) binds
			slots <- struct{}{}
			wg.Add(1)
			go func() {
				defer func() { <-slots; wg.Done() }()
				_, _ = c.handle(ctx, s, d, decider(d))
			}()
		}
	}
}

func closeErr(e *amqp.Error) error {
	if e == nil {
		return errClosed
	}
	return fmt.Errorf("idemrabbit: the broker closed the channel: %w", e)
}
