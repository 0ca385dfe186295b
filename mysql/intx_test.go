package mysql

import (
	"context"
	"errors"
	"testing"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemhttp"
	"github.com/seed094d4201/idem/internal/httptxtest"
	"github.com/stretchr/testify/require"
)

// idemhttp's transactional mode over MySQL: a handler's charge, its key
// and its response commit together, or none of them does; a handler that
// COMMITs itself leaves its key interrupted, as documented.
func TestHTTPInTx(t *testing.T) {
	db := testDB(t)
	for _, shape := range shapes {
		t.Run(shape.name, func(t *testing.T) {
			httptxtest.Run(t, httptxtest.Harness{
				New: func(t *testing.T, opts idem.Options) *httptxtest.Fixture {
					b, table := testBackend(t, db)
					shape.apply(b)
					charges := table + "_charges"
					_, err := db.Exec("CREATE TABLE " + charges + " (id BIGINT AUTO_INCREMENT PRIMARY KEY, amount BIGINT NOT NULL) ENGINE = InnoDB")
					require.NoError(t, err)
					t.Cleanup(func() { _, _ = db.Exec("DROP TABLE IF EXISTS " + charges) })
					store := func(b *Backend, opts idem.Options) *idem.Store[idemhttp.Response] {
						opts.Backend = b
						s := idem.New[idemhttp.Response](opts)
						t.Cleanup(func() { s.Close() })
						return s
					}
					return &httptxtest.Fixture{
						Store: store(b, opts),
						Second: func(t *testing.T, opts idem.Options) *idem.Store[idemhttp.Response] {
							b2, err := New(context.Background(), testDB(t), Options{Table: table}) // a pool of its own, as another process has
							require.NoError(t, err)
							shape.apply(b2)
							return store(b2, opts)
						},
						Charge: func(ctx context.Context) (int64, error) {
							tx, ok := TxFromContext(ctx)
							if !ok {
								return 0, errors.New("no transaction in the handler's context")
							}
							res, err := tx.ExecContext(ctx, "INSERT INTO "+charges+" (amount) VALUES (1250)")
							if err != nil {
								return 0, err
							}
							return res.LastInsertId()
						},
						Charges: func() int { return count(t, db, "SELECT count(*) FROM "+charges) },
						EndTx: func(ctx context.Context, commit bool) error {
							tx, _ := TxFromContext(ctx)
							if commit {
								return tx.Commit()
							}
							return tx.Rollback()
						},
					}
				},
				InTx:            InTx[idemhttp.Response],
				SelfCommitKeeps: true,
			})
		})
	}
}
