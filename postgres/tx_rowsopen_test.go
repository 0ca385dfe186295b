package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/seed094d4201/idem"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An fn that returns with the rows of a query still open leaves its
// connection busy, so the outcome and the COMMIT cannot be sent: nothing
// went to the server, so nothing committed, and RunOnceTx says so at once
// (as pgx's own Commit would), rather than asking the server for
// SettleTimeout about a COMMIT it never sent. The key is free again.
func TestRunOnceTxFnLeavingRowsOpenFailsAtOnce(t *testing.T) {
	pool := testPool(t)
	b, table := testBackend(t, pool)
	charges := table + "_charges"
	_, err := pool.Exec(context.Background(), "CREATE TABLE "+charges+" (id serial PRIMARY KEY, ord int NOT NULL)")
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+charges) })
	const settle = 20 * time.Second
	s := idem.New[int](idem.Options{Backend: b, SettleTimeout: settle})
	t.Cleanup(func() { s.Close() })
	ctx := context.Background()
	start := time.Now()
	_, err = RunOnceTx(ctx, s, "open", "p", func(ctx context.Context, tx pgx.Tx) (int, error) {
		if _, err := tx.Exec(ctx, "INSERT INTO "+charges+" (ord) VALUES (1)"); err != nil {
			return 0, err
		}
		_, err := tx.Query(ctx, "SELECT generate_series(1, 3)") // never closed
		return 1, err
	})
	took := time.Since(start)
	require.Error(t, err)
	assert.ErrorContains(t, err, "rows")
	assert.Less(t, took, settle/4, "the call waited on a COMMIT it never sent")
	assert.Zero(t, count(t, pool, "SELECT count(*) FROM "+charges), "fn's write was not committed")
	v, err := RunOnceTx(ctx, s, "open", "p", func(ctx context.Context, tx pgx.Tx) (int, error) { return 2, nil })
	require.NoError(t, err)
	assert.Equal(t, 2, v, "the key was left free: the retry ran")
}

// An fn that outlives the store's ExecutionTimeout and then succeeds has
// nothing sent after it: its ctx ended, so pgx sends no outcome and no
// COMMIT. RunOnceTx says so at once, committing nothing, rather than
// asking the server for SettleTimeout about the fate of a transaction its
// own connection still holds open. The key is free again.
func TestRunOnceTxFnOutlivingItsExecutionTimeoutFailsAtOnce(t *testing.T) {
	pool := testPool(t)
	b, _ := testBackend(t, pool)
	const settle = 20 * time.Second
	s := idem.New[int](idem.Options{Backend: b, ExecutionTimeout: 200 * time.Millisecond, SettleTimeout: settle})
	t.Cleanup(func() { s.Close() })
	ctx := context.Background()
	start := time.Now()
	_, err := RunOnceTx(ctx, s, "late", "p", func(ctx context.Context, tx pgx.Tx) (int, error) {
		<-ctx.Done()
		return 1, nil
	})
	took := time.Since(start)
	require.Error(t, err)
	assert.Less(t, took, settle/4, "the call waited on a COMMIT it never sent")
	v, err := RunOnceTx(ctx, s, "late", "p", func(ctx context.Context, tx pgx.Tx) (int, error) { return 2, nil })
	require.NoError(t, err)
	assert.Equal(t, 2, v, "the key was left free: the retry ran")
}
