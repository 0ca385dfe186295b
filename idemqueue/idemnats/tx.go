package idemnats

import (
	"context"
	"errors"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemqueue"
)

// A TxConsumer handles JetStream messages whose handler writes to the
// store's own database, in the transaction that commits the message's
// key with its outcome, and settles them as Consumer does. It is safe for
// concurrent use.
type TxConsumer[R, Tx any] struct {
	c  *Consumer[R]
	tx *idemqueue.TxConsumer[R, Tx]
}

// NewTx returns a TxConsumer over store, whose handlers run through run,
// the RunOnceTx of store's backend: one call from a store to a worker.
//
//	c, err := idemnats.NewTx(store, sqlite.RunOnceTx[Receipt], idemnats.Options{})
//
// A store on another backend than run's is refused here
// (idemqueue.NewTx), not at the first message. opts.Consumer configures
// the decisions.
func NewTx[R, Tx any](store *idem.Store[R], run idemqueue.RunOnceTx[R, Tx], opts Options) (*TxConsumer[R, Tx], error) {
	tx, err := idemqueue.NewTx(store, run, opts.Consumer)
	if err != nil {
		return nil, err
	}
	c, err := New(tx.Consumer(), opts)
	if err != nil {
		return nil, err
	}
	return &TxConsumer[R, Tx]{c: c, tx: tx}, nil
}

// Consumer returns the Consumer that settles for c: its Handle, for a
// handler that does not write to the database.
func (c *TxConsumer[R, Tx]) Consumer() *Consumer[R] { return c.c }

// Handle runs fn once for msg, given the message and the transaction its
// writes go through, commits them with msg's key and fn's outcome, and
// settles msg as Consumer.HandleTx does. Decision.Replayed reports a
// redelivery answered with the outcome an earlier one recorded.
func (c *TxConsumer[R, Tx]) Handle(ctx context.Context, msg jetstream.Msg, fn func(ctx context.Context, tx Tx, msg jetstream.Msg) (R, error)) (idemqueue.Decision, error) {
	if fn == nil {
		return idemqueue.Decision{}, errors.New("idemnats: TxConsumer.Handle with a nil handler")
	}
	return c.c.HandleTx(ctx, msg, c.tx.Call(func(ctx context.Context, tx Tx) (R, error) { return fn(ctx, tx, msg) }))
}

// MessageHandler returns a jetstream.MessageHandler that handles each
// message with Handle, for Consumer.Consume; report, if not nil, is told
// each message's decision and the error of settling it.
func (c *TxConsumer[R, Tx]) MessageHandler(ctx context.Context, fn func(ctx context.Context, tx Tx, msg jetstream.Msg) (R, error), report func(jetstream.Msg, idemqueue.Decision, error)) jetstream.MessageHandler {
	return func(msg jetstream.Msg) {
		d, err := c.Handle(ctx, msg, fn)
		if report != nil {
			report(msg, d, err)
		}
	}
}
