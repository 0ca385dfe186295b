package sqlite

import (
	"context"
	"errors"
	"testing"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemhttp"
	"github.com/seed094d4201/idem/internal/httptxtest"
	"github.com/stretchr/testify/require"
)

// idemhttp's transactional mode over SQLite: a handler's charge, its key
// and its response commit together, or none of them does.
func TestHTTPInTx(t *testing.T) {
	httptxtest.Run(t, httptxtest.Harness{
		New: func(t *testing.T, opts idem.Options) *httptxtest.Fixture {
			b, path := testBackend(t)
			_, err := b.db.Exec(`CREATE TABLE charges (id INTEGER PRIMARY KEY AUTOINCREMENT, amount INTEGER NOT NULL)`)
			require.NoError(t, err)
			store := func(b *Backend, opts idem.Options) *idem.Store[idemhttp.Response] {
				opts.Backend = b
				s := idem.New[idemhttp.Response](opts)
				t.Cleanup(func() { s.Close() })
				return s
			}
			return &httptxtest.Fixture{
				Store: store(b, opts),
				Second: func(t *testing.T, opts idem.Options) *idem.Store[idemhttp.Response] {
					db, err := Open(path) // a pool of its own, as another process has
					require.NoError(t, err)
					t.Cleanup(func() { db.Close() })
					b2, err := New(context.Background(), db, Options{})
					require.NoError(t, err)
					return store(b2, opts)
				},
				Charge: func(ctx context.Context) (int64, error) {
					tx, ok := TxFromContext(ctx)
					if !ok {
						return 0, errors.New("no transaction in the handler's context")
					}
					var id int64
					err := tx.QueryRowContext(ctx, `INSERT INTO charges (amount) VALUES (1250) RETURNING id`).Scan(&id)
					return id, err
				},
				Charges: func() int {
					var n int
					require.NoError(t, b.db.QueryRow(`SELECT count(*) FROM charges`).Scan(&n))
					return n
				},
				EndTx: func(ctx context.Context, commit bool) error {
					tx, _ := TxFromContext(ctx)
					if commit {
						return tx.Commit()
					}
					return tx.Rollback()
				},
			}
		},
		InTx: InTx[idemhttp.Response],
	})
}
