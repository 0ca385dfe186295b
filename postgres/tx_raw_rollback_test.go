package postgres

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An fn that ends its transaction with a ROLLBACK statement (not through
// the tx's Rollback) takes the claim with it; what it writes after that
// would commit on its own, outside any key, and every retry would write it
// again. Every statement after the transaction ended is refused instead,
// so nothing commits and the retry runs against a clean table (before:
// one row a call, 3 after three calls with one key).
func TestRunOnceTxFnRawRollbackCommitsNothingAfterIt(t *testing.T) {
	s, pool, charges := txFixture(t)
	ctx := context.Background()
	for range 3 {
		_, err := RunOnceTx(ctx, s, "k", "p", func(ctx context.Context, tx pgx.Tx) (int, error) {
			if _, err := tx.Exec(ctx, "ROLLBACK"); err != nil {
				return 0, err
			}
			_, err := tx.Exec(ctx, "INSERT INTO "+charges+" (ord) VALUES (7)")
			assert.ErrorIs(t, err, pgx.ErrTxClosed, "a write after the transaction ended is refused")
			var n int
			err = tx.QueryRow(ctx, "SELECT 1").Scan(&n)
			assert.ErrorIs(t, err, pgx.ErrTxClosed, "and so is a read")
			return 1, nil
		})
		require.Error(t, err, "the call fails: the transaction it would commit was ended inside fn")
	}
	assert.Equal(t, 0, count(t, pool, "SELECT count(*) FROM "+charges), "no write of fn's committed")
	v, err := RunOnceTx(ctx, s, "k", "p", func(ctx context.Context, tx pgx.Tx) (int, error) {
		_, err := tx.Exec(ctx, "INSERT INTO "+charges+" (ord) VALUES (8)")
		return 2, err
	})
	require.NoError(t, err, "the key is free")
	assert.Equal(t, 2, v)
	assert.Equal(t, 1, count(t, pool, "SELECT count(*) FROM "+charges))
}
