package mysql

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/internal/txtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// moves creates the caller's own table beside the backend's, dropped when
// the test ends.
func moves(t *testing.T, db *sql.DB, table string) string {
	t.Helper()
	name := table + "_moves"
	_, err := db.Exec("CREATE TABLE " + name + " (id BIGINT AUTO_INCREMENT PRIMARY KEY, note VARBINARY(255) NOT NULL) ENGINE = InnoDB")
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = db.Exec("DROP TABLE IF EXISTS " + name) })
	return name
}

func count(t *testing.T, db *sql.DB, query string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, db.QueryRow(query, args...).Scan(&n))
	return n
}

func TestRunOnceTx(t *testing.T) {
	db := testDB(t)
	for _, shape := range shapes {
		t.Run(shape.name, func(t *testing.T) {
			tables := map[*idem.Store[int]]string{}
			txtest.Run(t, txtest.Harness{
				New: func(t *testing.T, opts idem.Options) (*idem.Store[int], func() int) {
					b, table := testBackend(t, db)
					shape.apply(b)
					name := moves(t, db, table)
					opts.Backend = b
					s := idem.New[int](opts)
					t.Cleanup(func() { s.Close() })
					tables[s] = name
					return s, func() int { return count(t, db, "SELECT count(*) FROM "+name) }
				},
				RunOnceTx: func(ctx context.Context, s *idem.Store[int], key string, payload any, fn func(context.Context, func() (int, error)) (int, error)) (int, error) {
					if fn == nil {
						return RunOnceTx(ctx, s, key, payload, nil)
					}
					name := tables[s]
					return RunOnceTx(ctx, s, key, payload, func(ctx context.Context, tx *sql.Tx) (int, error) {
						return fn(ctx, func() (int, error) {
							res, err := tx.ExecContext(ctx, "INSERT INTO "+name+" (note) VALUES (?)", []byte(key))
							if err != nil {
								return 0, err
							}
							id, err := res.LastInsertId()
							return int(id), err
						})
					})
				},
				ServerClock: true,
			})
		})
	}
}

// txFixture is a store over a fresh table, and a table for fn's own writes.
func txFixture(t *testing.T, db *sql.DB) (*idem.Store[int], *Backend, string) {
	b, table := testBackend(t, db)
	name := moves(t, db, table)
	s := idem.New[int](idem.Options{Backend: b})
	t.Cleanup(func() { s.Close() })
	return s, b, name
}

// A fn that ends the transaction itself (misuse: a COMMIT, or DDL, which
// MySQL commits implicitly) commits the claim without an outcome. Its
// lease has lapsed already, so the key reads as interrupted: a later call
// answers ErrOutcomeUnknown at once, and Forget frees the key.
func TestRunOnceTxFnEndsTheTransaction(t *testing.T) {
	db := testDB(t)
	for _, end := range []struct{ name, stmt string }{
		{"Commit", "COMMIT"},
		{"DDL", "CREATE TABLE IF NOT EXISTS idem_test_ddl_commits (id INT) ENGINE = InnoDB"},
	} {
		t.Run(end.name, func(t *testing.T) {
			t.Cleanup(func() { _, _ = db.Exec("DROP TABLE IF EXISTS idem_test_ddl_commits") })
			s, _, name := txFixture(t, db)
			ctx := context.Background()
			_, err := RunOnceTx(ctx, s, "k", "p", func(ctx context.Context, tx *sql.Tx) (int, error) {
				if _, err := tx.ExecContext(ctx, "INSERT INTO "+name+" (note) VALUES ('x')"); err != nil {
					return 0, err
				}
				_, err := tx.ExecContext(ctx, end.stmt)
				return 1, err
			})
			require.Error(t, err, "a transaction fn ended cannot record the outcome")
			require.Equal(t, 1, count(t, db, "SELECT count(*) FROM "+name), "the misuse committed fn's write, with the claim")

			wait, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			start := time.Now()
			_, err = RunOnceTx(wait, s, "k", "p", func(context.Context, *sql.Tx) (int, error) { return 2, nil })
			assert.ErrorIs(t, err, idem.ErrOutcomeUnknown, "the stray claim reads as interrupted")
			assert.Less(t, time.Since(start), 5*time.Second, "answered at once, not after the caller's ctx")
			_, err = s.RunOnce(wait, "k", "p", func(context.Context) (int, error) { return 2, nil })
			assert.ErrorIs(t, err, idem.ErrOutcomeUnknown)

			require.NoError(t, s.Forget(ctx, "k"), "an operator can free the key")
			v, err := RunOnceTx(ctx, s, "k", "p", func(context.Context, *sql.Tx) (int, error) { return 3, nil })
			require.NoError(t, err)
			assert.Equal(t, 3, v)
		})
	}
}

// A fn that deletes its own claim row would commit its writes without the
// key: nothing commits.
func TestRunOnceTxClaimDeletedInsideFn(t *testing.T) {
	db := testDB(t)
	s, b, name := txFixture(t, db)
	_, err := RunOnceTx(context.Background(), s, "k", "p", func(ctx context.Context, tx *sql.Tx) (int, error) {
		if _, err := tx.ExecContext(ctx, "INSERT INTO "+name+" (note) VALUES ('x')"); err != nil {
			return 0, err
		}
		_, err := tx.ExecContext(ctx, "DELETE FROM "+b.q.t+" WHERE `key` = 'k'")
		return 1, err
	})
	require.ErrorIs(t, err, errClaimGone)
	assert.Zero(t, count(t, db, "SELECT count(*) FROM "+name), "fn's write rolled back with it")
	_, found, err := b.Get(context.Background(), "k", time.Time{})
	require.NoError(t, err)
	assert.False(t, found)
}

// A RunOnceTx nested in another's fn, with fn's ctx, on a pool of one
// connection would wait for a second connection for ever: it is refused
// at once, and so is a plain RunOnce there. On a larger pool a plain
// RunOnce inside fn works.
func TestRunOnceTxNested(t *testing.T) {
	db := testDB(t)
	db.SetMaxOpenConns(1)
	b, _ := testBackend(t, db)
	s := idem.New[int](idem.Options{Backend: b})
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var nested, plain error
	v, err := RunOnceTx(ctx, s, "outer", "p", func(ctx context.Context, tx *sql.Tx) (int, error) {
		_, nested = RunOnceTx(ctx, s, "inner", "p", func(context.Context, *sql.Tx) (int, error) { return 1, nil })
		_, plain = s.RunOnce(ctx, "plain", "p", func(context.Context) (int, error) { return 1, nil })
		return 5, nil
	})
	require.NoError(t, err)
	assert.Equal(t, 5, v)
	assert.ErrorIs(t, nested, backend.ErrRefused)
	assert.ErrorIs(t, nested, errNested)
	assert.ErrorIs(t, plain, backend.ErrRefused)
	require.NoError(t, ctx.Err(), "refused at once, not at the deadline")

	db.SetMaxOpenConns(4)
	_, err = RunOnceTx(ctx, s, "outer2", "p", func(ctx context.Context, tx *sql.Tx) (int, error) {
		_, plain = s.RunOnce(ctx, "plain2", "p", func(context.Context) (int, error) { return 1, nil })
		return 1, nil
	})
	require.NoError(t, err)
	assert.NoError(t, plain, "on a larger pool a plain call inside fn works")
}

// Any other call of a store made with fn's ctx on a pool of one
// connection, which fn's transaction holds, is refused at once too: a
// Forget, a Resolve, a Sweep or a listing inside fn waited for that
// connection until its ctx ended, for ever without a deadline (fn waits
// for the call, the call for fn's connection).
func TestRunOnceTxNestedCallsOnPoolOfOneAreRefused(t *testing.T) {
	db := testDB(t)
	db.SetMaxOpenConns(1)
	b, _ := testBackend(t, db)
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
