package postgres

import (
	"context"
	"errors"
	"testing"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemhttp"
	"github.com/seed094d4201/idem/internal/httptxtest"
	"github.com/stretchr/testify/require"
)

// idemhttp's transactional mode over PostgreSQL: a handler's charge, its
// key and its response commit together, or none of them does; a handler
// that commits its transaction itself ends only a savepoint, and the
// request fails with nothing committed.
func TestHTTPInTx(t *testing.T) {
	pool := testPool(t)
	httptxtest.Run(t, httptxtest.Harness{
		New: func(t *testing.T, opts idem.Options) *httptxtest.Fixture {
			b, table := testBackend(t, pool)
			charges := table + "_charges"
			_, err := pool.Exec(context.Background(), "CREATE TABLE "+charges+" (id BIGSERIAL PRIMARY KEY, amount BIGINT NOT NULL)")
			require.NoError(t, err)
			t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+charges) })
			store := func(b *Backend, opts idem.Options) *idem.Store[idemhttp.Response] {
				opts.Backend = b
				s := idem.New[idemhttp.Response](opts)
				t.Cleanup(func() { s.Close() })
				return s
			}
			return &httptxtest.Fixture{
				Store: store(b, opts),
				Second: func(t *testing.T, opts idem.Options) *idem.Store[idemhttp.Response] {
					b2, err := New(context.Background(), testPool(t), Options{Table: table}) // a pool of its own, as another process has
					require.NoError(t, err)
					return store(b2, opts)
				},
				Charge: func(ctx context.Context) (int64, error) {
					tx, ok := TxFromContext(ctx)
					if !ok {
						return 0, errors.New("no transaction in the handler's context")
					}
					var id int64
					err := tx.QueryRow(ctx, "INSERT INTO "+charges+" (amount) VALUES (1250) RETURNING id").Scan(&id)
					return id, err
				},
				Charges: func() int {
					var n int
					require.NoError(t, pool.QueryRow(context.Background(), "SELECT count(*) FROM "+charges).Scan(&n))
					return n
				},
				EndTx: func(ctx context.Context, commit bool) error {
					tx, _ := TxFromContext(ctx)
					if commit {
						return tx.Commit(ctx)
					}
					return tx.Rollback(ctx)
				},
			}
		},
		InTx: InTx[idemhttp.Response],
	})
}
