package postgres

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/seed094d4201/idem/internal/svctest"
	"github.com/seed094d4201/idem/internal/txrun"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// txFixture is a store over a fresh table, and a charges table for fn's own
// writes.
func txFixture(t *testing.T) (*idem.Store[int], *pgxpool.Pool, string) {
	pool := testPool(t)
	b, table := testBackend(t, pool)
	charges := table + "_charges"
	_, err := pool.Exec(context.Background(), "CREATE TABLE "+charges+" (id serial PRIMARY KEY, ord int NOT NULL)")
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+charges) })
	s := idem.New[int](idem.Options{Backend: b})
	t.Cleanup(func() { s.Close() })
	return s, pool, charges
}

func count(t *testing.T, pool *pgxpool.Pool, query string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), query, args...).Scan(&n))
	return n
}

func TestRunOnceTx(t *testing.T) {
	s, pool, charges := txFixture(t)
	ctx := context.Background()
	charge := func(ctx context.Context, tx pgx.Tx) (int, error) {
		var id int
		err := tx.QueryRow(ctx, "INSERT INTO "+charges+" (ord) VALUES (101) RETURNING id").Scan(&id)
		return id, err
	}
	keys := func(key string) int {
		_, found, err := txrun.Of(s).Options().Backend.Get(ctx, key, time.Now())
		require.NoError(t, err)
		if found {
			return 1
		}
		return 0
	}

	t.Run("success commits both", func(t *testing.T) {
		id, err := RunOnceTx(ctx, s, "ok", "p", charge)
		require.NoError(t, err)
		again, err := RunOnceTx(ctx, s, "ok", "p", charge)
		require.NoError(t, err)
		assert.Equal(t, id, again, "a retry replays")
		assert.Equal(t, 1, count(t, pool, "SELECT count(*) FROM "+charges+" WHERE id = $1", id))
		assert.Equal(t, 1, keys("ok"))
		_, err = RunOnceTx(ctx, s, "ok", "other", charge)
		assert.ErrorIs(t, err, idem.ErrPayloadMismatch)
	})

	t.Run("error leaves neither", func(t *testing.T) {
		before := count(t, pool, "SELECT count(*) FROM "+charges)
		boom := errors.New("bank said no, try later")
		_, err := RunOnceTx(ctx, s, "fails", "p", func(ctx context.Context, tx pgx.Tx) (int, error) {
			if _, err := charge(ctx, tx); err != nil {
				return 0, err
			}
			return 0, boom
		})
		assert.ErrorIs(t, err, boom)
		assert.Equal(t, before, count(t, pool, "SELECT count(*) FROM "+charges), "no row of the caller's write")
		assert.Equal(t, 0, keys("fails"), "and no key")
	})

	t.Run("panic leaves neither", func(t *testing.T) {
		before := count(t, pool, "SELECT count(*) FROM "+charges)
		_, err := RunOnceTx(ctx, s, "panics", "p", func(ctx context.Context, tx pgx.Tx) (int, error) {
			_, _ = charge(ctx, tx)
			panic("bug")
		})
		var pe *idem.PanicError
		assert.ErrorAs(t, err, &pe)
		assert.Equal(t, before, count(t, pool, "SELECT count(*) FROM "+charges))
		assert.Equal(t, 0, keys("panics"))
	})

	t.Run("final error keeps the key, not the writes", func(t *testing.T) {
		before := count(t, pool, "SELECT count(*) FROM "+charges)
		declined := func(ctx context.Context, tx pgx.Tx) (int, error) {
			_, _ = charge(ctx, tx)
			return 0, idem.Final(errors.New("card declined"))
		}
		_, err := RunOnceTx(ctx, s, "declined", "p", declined)
		assert.True(t, idem.IsFinal(err))
		_, err = RunOnceTx(ctx, s, "declined", "p", declined)
		assert.EqualError(t, err, "card declined")
		assert.True(t, idem.IsFinal(err))
		assert.Equal(t, before, count(t, pool, "SELECT count(*) FROM "+charges))
	})

	t.Run("concurrent duplicates replay", func(t *testing.T) {
		before := count(t, pool, "SELECT count(*) FROM "+charges)
		var wg sync.WaitGroup
		ids := make([]int, 8)
		errs := make([]error, 8)
		for i := range ids {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ids[i], errs[i] = RunOnceTx(ctx, s, "dup", "p", charge)
			}()
		}
		wg.Wait()
		for i := range ids {
			require.NoError(t, errs[i])
			assert.Equal(t, ids[0], ids[i])
		}
		assert.Equal(t, before+1, count(t, pool, "SELECT count(*) FROM "+charges), fmt.Sprint("one charge for ", len(ids), " calls"))
	})
}

// A sweep that removes an expired record between RunOnceTx finding it and
// taking it over does not fail the call: it claims again, as Claim does.
func TestRunOnceTxSweptDuringTakeover(t *testing.T) {
	pool := testPool(t)
	b, table := testBackend(t, pool)
	s := idem.New[int](idem.Options{Backend: b, TTL: time.Millisecond, SweepInterval: -1})
	defer s.Close()
	_, err := s.RunOnce(context.Background(), "k", "p", func(context.Context) (int, error) { return 1, nil })
	require.NoError(t, err)
	for deadline := time.Now().Add(10 * time.Second); ; { // until it expires by the server's clock
		if _, ok, err := b.Get(context.Background(), "k", time.Time{}); err == nil && !ok {
			break
		}
		require.True(t, time.Now().Before(deadline), "the record never expired")
		time.Sleep(5 * time.Millisecond)
	}
	testHookBeforeTakeover = func() {
		_, err := pool.Exec(context.Background(), "DELETE FROM "+pgx.Identifier{table}.Sanitize()+" WHERE key = 'k'")
		require.NoError(t, err)
	}
	defer func() { testHookBeforeTakeover = nil }()
	v, err := RunOnceTx(context.Background(), s, "k", "p", func(context.Context, pgx.Tx) (int, error) { return 2, nil })
	require.NoError(t, err)
	assert.Equal(t, 2, v)
}

// idemtest's session-clock check. A PostgreSQL session cannot move now();
// the nearest it comes is its time zone, which fn sets d/3600 hours off
// (within the ±15 hours an interval zone may be), and which moves no
// instant.
func TestRunOnceTxSessionClock(t *testing.T) {
	pool := testPool(t)
	idemtest.RunSessionClock(t, idemtest.SessionClockHarness{
		Backend: func(t *testing.T) backend.Backend {
			b, _ := testBackend(t, pool)
			return b
		},
		RunOnceTx: func(ctx context.Context, s *idem.Store[int], key string, payload any, fn func(context.Context, func(time.Duration) error) (int, error)) (int, error) {
			return RunOnceTx(ctx, s, key, payload, func(ctx context.Context, tx pgx.Tx) (int, error) {
				return fn(ctx, func(d time.Duration) error {
					h := max(min(int(d.Hours()), 15), -15)
					_, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL TIME ZONE INTERVAL '%+d:00' HOUR TO MINUTE", h))
					return err
				})
			})
		},
	})
}

// Any other call of a store made with fn's ctx on a pool of one
// connection, which fn's transaction holds, is refused at once too: a
// Forget, a Resolve, a Sweep or a listing inside fn waited for that
// connection for ever (fn's ctx does not end with its caller's: fn waits
// for the call, the call for fn's connection).
func TestRunOnceTxNestedCallsOnPoolOfOneAreRefused(t *testing.T) {
	testPool(t) // or skip
	cfg, err := pgxpool.ParseConfig(svctest.Postgres(t))
	require.NoError(t, err)
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	b, _ := testBackend(t, pool)
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
			_, err := RunOnceTx(ctx, s, "outer-"+name, "p", func(ctx context.Context, tx pgx.Tx) (int, error) {
				nested = call(ctx)
				return 5, nil
			})
			require.NoError(t, err)
			assert.ErrorIs(t, nested, errNested)
			assert.NoError(t, ctx.Err(), "refused at once, not at the deadline")
		})
	}
}
