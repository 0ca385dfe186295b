package sqlite

import (
	"context"
	"database/sql"
	"testing"

	"github.com/seed094d4201/idem"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A fn that deletes its own claim row (misuse) must not commit its writes
// without the key: the outcome's UPDATE then changes no row, and the whole
// transaction rolls back.
func TestRunOnceTxFnDeletesItsClaim(t *testing.T) {
	s, _, rows := movesStore(t, idem.Options{})
	ctx := context.Background()
	_, err := RunOnceTx(ctx, s, "k", "p", func(ctx context.Context, tx *sql.Tx) (int, error) {
		if _, err := tx.ExecContext(ctx, `INSERT INTO moves (note) VALUES ('a')`); err != nil {
			return 0, err
		}
		_, err := tx.ExecContext(ctx, `DELETE FROM idem_keys WHERE key = 'k'`)
		return 1, err
	})
	require.Error(t, err)
	assert.ErrorIs(t, err, errClaimGone)
	assert.Equal(t, 0, rows(), "fn's write committed without its key")

	// The key is free: a retry runs and commits once.
	v, err := RunOnceTx(ctx, s, "k", "p", func(ctx context.Context, tx *sql.Tx) (int, error) {
		_, err := tx.ExecContext(ctx, `INSERT INTO moves (note) VALUES ('a')`)
		return 2, err
	})
	require.NoError(t, err)
	assert.Equal(t, 2, v)
	assert.Equal(t, 1, rows())
}
