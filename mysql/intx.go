package mysql

import (
	"context"
	"database/sql"
	"errors"

	"github.com/seed094d4201/idem"
)

// InTx is RunOnceTx for a function that finds its transaction in its
// context rather than in an argument, as an HTTP handler does: fn's ctx
// carries the transaction, and TxFromContext returns it. It is what the
// transactional mode of package idemhttp runs (its Options.InTx, set to
// InTx[idemhttp.Response]), so that a handler's writes, its key and its
// response commit together. Everything RunOnceTx says of fn holds for
// it: it writes through the transaction only, and never commits or rolls
// it back itself.
func InTx[R any](ctx context.Context, store *idem.Store[R], key string, payload any, fn func(ctx context.Context) (R, error)) (R, error) {
	if fn == nil {
		var zero R
		return zero, errors.New("mysql: InTx with a nil fn")
	}
	return RunOnceTx(ctx, store, key, payload, func(ctx context.Context, tx *sql.Tx) (R, error) {
		return fn(context.WithValue(ctx, txKey{}, tx))
	})
}

// TxFromContext returns the transaction that InTx runs its fn in, from
// fn's ctx or a context derived from it, and false for any other context.
func TxFromContext(ctx context.Context) (*sql.Tx, bool) {
	tx, ok := ctx.Value(txKey{}).(*sql.Tx)
	return tx, ok
}

// txKey is the context key of InTx's transaction.
type txKey struct{}
