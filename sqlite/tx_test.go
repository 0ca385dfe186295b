package sqlite

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/seed094d4201/idem/internal/txtest"
	"github.com/stretchr/testify/assert"
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

// idemtest's session-clock check: SQLite's instants are the store's
// Options.Now, which fn's transaction cannot move, so the shift does
// nothing.
func TestRunOnceTxSessionClock(t *testing.T) {
	idemtest.RunSessionClock(t, idemtest.SessionClockHarness{
		Backend: func(t *testing.T) backend.Backend {
			b, _ := testBackend(t)
			return b
		},
		RunOnceTx: func(ctx context.Context, s *idem.Store[int], key string, payload any, fn func(context.Context, func(time.Duration) error) (int, error)) (int, error) {
			return RunOnceTx(ctx, s, key, payload, func(ctx context.Context, _ *sql.Tx) (int, error) {
				return fn(ctx, func(time.Duration) error { return nil })
			})
		},
	})
}

// Any call of a store made with fn's ctx on a pool of one connection
// (db.SetMaxOpenConns(1)), which fn's transaction holds, is refused at
// once: a write would wait for the write lock fn holds, and a read (a
// listing, a Get) for the connection, for ever, fn's ctx not ending with
// its caller's.
func TestRunOnceTxNestedCallsOnPoolOfOneAreRefused(t *testing.T) {
	db, _ := openTemp(t)
	db.SetMaxOpenConns(1)
	b, err := New(context.Background(), db, Options{})
	require.NoError(t, err)
	s := idem.New[int](idem.Options{Backend: b})
	defer s.Close()
	calls := map[string]func(context.Context) error{
		"Forget":  func(ctx context.Context) error { return s.Forget(ctx, "other") },
		"Resolve": func(ctx context.Context) error { return s.Resolve(ctx, "other", 1, nil) },
		"Sweep":   func(ctx context.Context) error { _, err := s.Sweep(ctx); return err },
		"Records": func(ctx context.Context) error {
			for _, err := range s.Records(ctx) {
				return err
			}
			return nil
		},
		"Get": func(ctx context.Context) error { _, _, err := b.Get(ctx, "other", time.Now()); return err },
	}
	for name, call := range calls {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			var nested error
			_, err := RunOnceTx(ctx, s, "outer-"+name, "p", func(ctx context.Context, tx *sql.Tx) (int, error) {
				nested = call(ctx)
				return 5, nil
			})
			require.NoError(t, err)
			assert.ErrorIs(t, nested, errNested)
			assert.NoError(t, ctx.Err(), "refused at once, not at the deadline")
		})
	}
}
