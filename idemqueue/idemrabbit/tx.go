package idemrabbit

import (
	"context"
	"errors"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemqueue"
)

// A TxConsumer consumes a queue whose handler writes to the store's own
// database, in the transaction that commits the delivery's key with its
// outcome, and settles each delivery as Consumer does. It is safe for
// concurrent use.
type TxConsumer[R, Tx any] struct {
	c  *Consumer[R]
	tx *idemqueue.TxConsumer[R, Tx]
}

// NewTx returns a TxConsumer over store, whose handlers run through run,
// the RunOnceTx of store's backend: one call from a store to a worker.
//
//	c, err := idemrabbit.NewTx(store, postgres.RunOnceTx[Receipt], idemrabbit.Options{Queue: "orders"})
//
// A store on another backend than run's is refused here
// (idemqueue.NewTx), not at the first delivery. opts.Consumer configures
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

// Consumer returns the Consumer that settles for c: its Run, for a
// handler that does not write to the database.
func (c *TxConsumer[R, Tx]) Consumer() *Consumer[R] { return c.c }

// Run is Consumer.Run for a handler given the delivery and the
// transaction its writes go through: they commit with the delivery's key
// and fn's outcome. Decision.Replayed (Options.Report) reports a
// redelivery answered with the outcome an earlier one recorded.
func (c *TxConsumer[R, Tx]) Run(ctx context.Context, dial func(context.Context) (*amqp.Connection, error), fn func(ctx context.Context, tx Tx, d amqp.Delivery) (R, error)) error {
	if ctx == nil || dial == nil || fn == nil {
		return errors.New("idemrabbit: TxConsumer.Run with a nil context, dial or handler")
	}
	return c.c.run(ctx, dial, func(d amqp.Delivery) func(context.Context, string, any) idemqueue.Decision {
		return c.decider(d, fn)
	})
}

// decider decides for delivery d, running fn through the store's RunOnceTx.
func (c *TxConsumer[R, Tx]) decider(d amqp.Delivery, fn func(context.Context, Tx, amqp.Delivery) (R, error)) func(context.Context, string, any) idemqueue.Decision {
	return c.c.caller(c.tx.Call(func(ctx context.Context, tx Tx) (R, error) { return fn(ctx, tx, d) }))
}
