package idemqueue

import (
	"context"
	"errors"
	"fmt"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemqueue/internal/contain"
	"github.com/seed094d4201/idem/internal/txrun"
)

// A RunOnceTx is a backend's transactional mode for results of type R,
// whose handler writes through Tx, the backend's transaction:
// sqlite.RunOnceTx[R] (*sql.Tx), bolt.RunOnceTx[R] (*bbolt.Tx),
// postgres.RunOnceTx[R] (pgx.Tx) or mysql.RunOnceTx[R] (*sql.Tx).
type RunOnceTx[R, Tx any] func(ctx context.Context, store *idem.Store[R], key string, payload any, fn func(ctx context.Context, tx Tx) (R, error)) (R, error)

// A TxConsumer is a Consumer whose handlers write to the store's own
// database, in the transaction that commits the message's key with its
// outcome (RunOnceTx): the common path of a consumer on bolt, sqlite,
// postgres or mysql, typed, with no call to write around the backend's
// RunOnceTx. It is safe for concurrent use.
type TxConsumer[R, Tx any] struct {
	q   *Consumer[R]
	run RunOnceTx[R, Tx]
}

// NewTx returns a TxConsumer over store whose handlers run through run,
// the RunOnceTx of store's backend. A store whose Backend is not the one
// run needs (a sqlite.RunOnceTx over a bolt store), or no Backend, is
// refused here rather than at the first message: NewTx calls run once
// with an empty key, which every RunOnceTx refuses, after it has checked
// the store and before any work. A nil store or run is an error.
func NewTx[R, Tx any](store *idem.Store[R], run RunOnceTx[R, Tx], opts Options) (*TxConsumer[R, Tx], error) {
	if run == nil {
		return nil, errors.New("idemqueue: NewTx with a nil RunOnceTx")
	}
	q, err := New(store, opts)
	if err != nil {
		return nil, err
	}
	// run is the user's choice of a backend's code: contained, as every
	// call to it is.
	_, err = contain.Call(func() (R, error) {
		return run(context.Background(), store, "", nil, func(context.Context, Tx) (R, error) {
			var zero R
			return zero, errors.New("idemqueue: NewTx's check ran a handler") // never: the key is invalid
		})
	})
	if !errors.Is(err, idem.ErrInvalidKey) {
		return nil, fmt.Errorf("idemqueue: NewTx: the RunOnceTx does not take this store: %w", err)
	}
	return &TxConsumer[R, Tx]{q: q, run: run}, nil
}

// Consumer returns the Consumer that decides for c: its Store, Decide
// and Handle for a handler that does not write to the database.
func (c *TxConsumer[R, Tx]) Consumer() *Consumer[R] { return c.q }

// Handle runs fn once for key, the message's id, with payload (as
// Consumer.Handle takes them), in a transaction of the store's database
// that commits fn's writes through tx with the key and its outcome, and
// decides, as Consumer.HandleTx does; Decision.Replayed reports an
// outcome an earlier delivery recorded.
func (c *TxConsumer[R, Tx]) Handle(ctx context.Context, key string, payload any, fn func(ctx context.Context, tx Tx) (R, error)) Decision {
	if fn == nil {
		return c.q.decide(context.Background(), key, errors.New("idemqueue: TxConsumer.Handle with a nil fn"), fromCall)
	}
	return c.q.HandleTx(ctx, key, payload, c.Call(fn))
}

// Call returns the call Consumer.HandleTx takes (and the adapters'
// HandleTx, RunTx) that runs fn through the store's RunOnceTx: for an
// adapter that gives fn the message as well.
//
// Its wait for another delivery of the same id in flight in this
// process is bounded by Options.BusyWait, as Handle's is: past it, the
// call gives up (idem.ErrInProgress), so that HandleTx answers Retry
// after BusyDelay and the consumer's slot is not held for the whole of
// the other's handler. Once it owns the key, it waits for its own
// transaction, whatever BusyWait or ctx say: the outcome is this
// delivery's to settle. (A transaction's wait for its database, another
// process's row or a file's one writer, is the backend's, unbounded.)
func (c *TxConsumer[R, Tx]) Call(fn func(ctx context.Context, tx Tx) (R, error)) func(ctx context.Context, key string, payload any) error {
	return func(ctx context.Context, key string, payload any) error {
		if c.q.opts.BusyWait < 0 { // only ctx bounds the wait
			_, err := c.run(ctx, c.q.store, key, payload, fn)
			return err
		}
		wait := txrun.NewWaitBound(ctx, c.q.opts.BusyWait)
		defer wait.Stop()
		_, err := c.run(txrun.WithBound(wait.Ctx(), wait, key), c.q.store, key, payload, fn)
		return err
	}
}
