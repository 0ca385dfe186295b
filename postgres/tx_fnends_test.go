package postgres

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/seed094d4201/idem"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The outcome and the COMMIT go to the server together: an fn that took
// its claim away (deleted its row) and succeeded still commits nothing,
// neither its writes nor a key. With a final error, the deletion is one
// of fn's writes, rolled back with them: the key keeps the error.
func TestRunOnceTxFnDeletingItsClaimCommitsNothing(t *testing.T) {
	s, pool, table, charges := txTableFixture(t)
	ctx := context.Background()
	deleting := func(fnErr error) func(context.Context, pgx.Tx) (int, error) {
		return func(ctx context.Context, tx pgx.Tx) (int, error) {
			if _, err := tx.Exec(ctx, "INSERT INTO "+charges+" (ord) VALUES (9)"); err != nil {
				return 0, err
			}
			if _, err := tx.Exec(ctx, "DELETE FROM "+table); err != nil {
				return 0, err
			}
			return 1, fnErr
		}
	}
	_, err := RunOnceTx(ctx, s, "gone", "p", deleting(nil))
	require.ErrorContains(t, err, "claim row was changed or deleted inside fn")
	assert.Zero(t, count(t, pool, "SELECT count(*) FROM "+charges), "fn's write was not committed")
	assert.Zero(t, count(t, pool, "SELECT count(*) FROM "+table), "nor a key")

	declined := idem.Final(errors.New("declined"))
	_, err = RunOnceTx(ctx, s, "declined", "p", deleting(declined))
	require.ErrorIs(t, err, declined)
	assert.Zero(t, count(t, pool, "SELECT count(*) FROM "+charges), "fn's writes rolled back")
	_, err = RunOnceTx(ctx, s, "declined", "p", deleting(nil))
	assert.EqualError(t, err, "declined", "the key keeps its final error")
}

// An fn that commits or rolls back the transaction it is given ends the
// savepoint it runs in, not the claim's transaction: the call fails and
// commits nothing, even what fn writes afterwards on the connection.
func TestRunOnceTxFnEndingItsTxCommitsNothing(t *testing.T) {
	s, pool, table, charges := txTableFixture(t)
	ctx := context.Background()
	for name, end := range map[string]func(pgx.Tx, context.Context) error{"commit": pgx.Tx.Commit, "rollback": pgx.Tx.Rollback} {
		t.Run(name, func(t *testing.T) {
			var after error
			_, err := RunOnceTx(ctx, s, name, "p", func(ctx context.Context, tx pgx.Tx) (int, error) {
				if _, err := tx.Exec(ctx, "INSERT INTO "+charges+" (ord) VALUES (1)"); err != nil {
					return 0, err
				}
				if err := end(tx, ctx); err != nil {
					return 0, err
				}
				_, after = tx.Exec(ctx, "INSERT INTO "+charges+" (ord) VALUES (2)")
				_, err := tx.Conn().Exec(ctx, "INSERT INTO "+charges+" (ord) VALUES (3)")
				return 1, err
			})
			require.ErrorIs(t, err, pgx.ErrTxClosed)
			assert.ErrorIs(t, after, pgx.ErrTxClosed, "the ended tx takes no statement")
			assert.Zero(t, count(t, pool, "SELECT count(*) FROM "+charges), "nothing fn wrote was committed")
			assert.Zero(t, count(t, pool, "SELECT count(*) FROM "+table+" WHERE key = $1", name), "nor the key")
		})
	}
}

// txTableFixture is txFixture with the name of the keys' table, quoted.
func txTableFixture(t *testing.T) (*idem.Store[int], *pgxpool.Pool, string, string) {
	pool := testPool(t)
	b, table := testBackend(t, pool)
	charges := table + "_charges"
	_, err := pool.Exec(context.Background(), "CREATE TABLE "+charges+" (id serial PRIMARY KEY, ord int NOT NULL)")
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+charges) })
	s := idem.New[int](idem.Options{Backend: b})
	t.Cleanup(func() { s.Close() })
	return s, pool, pgx.Identifier{table}.Sanitize(), charges
}
