package sqlite

import (
	"context"
	"database/sql"
	"testing"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/internal/txtest"
	"github.com/stretchr/testify/require"
)

// stockTable is the caller's own table in the tests.
const stockTable = `CREATE TABLE IF NOT EXISTS moves (id INTEGER PRIMARY KEY AUTOINCREMENT, note TEXT NOT NULL)`

func TestRunOnceTx(t *testing.T) {
	txtest.Run(t, txtest.Harness{
		New: func(t *testing.T, opts idem.Options) (*idem.Store[int], func() int) {
			b, _ := testBackend(t)
			_, err := b.db.Exec(stockTable)
			require.NoError(t, err)
			opts.Backend = b
			s := idem.New[int](opts)
			t.Cleanup(func() { s.Close() })
			return s, func() int {
				var n int
				require.NoError(t, b.db.QueryRow(`SELECT count(*) FROM moves`).Scan(&n))
				return n
			}
		},
		RunOnceTx: func(ctx context.Context, s *idem.Store[int], key string, payload any, fn func(context.Context, func() (int, error)) (int, error)) (int, error) {
			if fn == nil {
				return RunOnceTx(ctx, s, key, payload, nil)
			}
			return RunOnceTx(ctx, s, key, payload, func(ctx context.Context, tx *sql.Tx) (int, error) {
				return fn(ctx, func() (int, error) {
					var id int
					err := tx.QueryRowContext(ctx, `INSERT INTO moves (note) VALUES (?) RETURNING id`, key).Scan(&id)
					return id, err
				})
			})
		},
	})
}
