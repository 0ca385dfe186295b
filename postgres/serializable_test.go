package postgres

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// serializablePool is a pool whose sessions default to SERIALIZABLE, as a
// team's database may (default_transaction_isolation), so that every
// statement the backend sends alone runs in a serializable transaction.
func serializablePool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	cfg := testPool(t).Config()
	cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = "serializable"
	cfg.MaxConns = 16
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	var iso string
	require.NoError(t, pool.QueryRow(context.Background(), "SHOW transaction_isolation").Scan(&iso))
	require.Equal(t, "serializable", iso)
	return pool
}

// TestSerializableDefault: under a SERIALIZABLE default, many callers
// claiming, completing, forgetting and sweeping the same keys at once,
// and taking expired ones over, never see a serialization failure
// (40001): every call succeeds and each key runs once per life.
func TestSerializableDefault(t *testing.T) {
	pool := serializablePool(t)
	b, _ := testBackend(t, pool)
	ctx := context.Background()
	s := idem.New[int](idem.Options{Backend: b, TTL: 30 * time.Millisecond, SweepInterval: -1})
	defer s.Close()
	const callers, keys, rounds = 16, 8, 40
	var wg sync.WaitGroup
	errs := make(chan error, callers*rounds*2)
	for c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range rounds {
				k := fmt.Sprint("k", (c+r)%keys)
				_, err := s.RunOnce(ctx, k, "p", func(context.Context) (int, error) { return r, nil })
				if err != nil {
					errs <- fmt.Errorf("RunOnce %s: %w", k, err)
				}
				if r%10 == 0 {
					if _, err := s.Sweep(ctx); err != nil {
						errs <- fmt.Errorf("Sweep: %w", err)
					}
				}
				if r%7 == 0 {
					if err := s.Forget(ctx, k); err != nil && !errors.Is(err, idem.ErrInProgress) {
						errs <- fmt.Errorf("Forget %s: %w", k, err)
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// Replicas starting together on a new table under a SERIALIZABLE default
// all succeed: the migration reads the catalog in READ COMMITTED, after
// the lock, so it sees the table the replica before it created. (Before,
// 30 of 40 such New calls failed: "finding its index: no rows".)
func TestConcurrentNewUnderSerializable(t *testing.T) {
	pool := serializablePool(t)
	for round := range 10 {
		table := fmt.Sprintf("idem_test_ser_%d_%d", time.Now().UnixNano(), round)
		var wg sync.WaitGroup
		errs := make([]error, 4)
		for i := range errs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, errs[i] = New(context.Background(), pool, Options{Table: table})
			}()
		}
		wg.Wait()
		_, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+table)
		for i, err := range errs {
			require.NoError(t, err, "round %d, replica %d", round, i)
		}
	}
}

// A conflict that never ends (a trigger that raises 40001 on every
// UPDATE) is retried until ctx ends, and the error says both.
func TestConflictThatNeverEnds(t *testing.T) {
	pool := testPool(t)
	b, table := testBackend(t, pool)
	ctx := context.Background()
	_, err := pool.Exec(ctx, `CREATE FUNCTION `+table+`_conflict() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'forced' USING ERRCODE = '40001'; END $$;
CREATE TRIGGER conflict BEFORE UPDATE ON `+table+` FOR EACH ROW EXECUTE FUNCTION `+table+`_conflict();`)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP FUNCTION IF EXISTS "+table+"_conflict CASCADE") })
	rec := backend.Record{Key: "k", Token: "t", State: backend.StatePending}
	_, won, err := b.Claim(ctx, rec, time.Now(), time.Minute)
	require.NoError(t, err)
	require.True(t, won)

	tctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	err = b.Complete(tctx, rec, time.Now(), time.Hour)
	require.Error(t, err)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.True(t, conflicted(err), "the conflict is kept: %v", err)
}

// A conflict that never ends, its statement cut short by ctx's end (each
// attempt outlasts what is left of ctx): the error still says both, the
// conflict that kept the statement retrying and ctx's end. The ctx once
// ended mid-statement only under load, and the error then said the
// socket's timeout alone.
func TestConflictThatNeverEndsCutMidStatement(t *testing.T) {
	pool := testPool(t)
	b, table := testBackend(t, pool)
	ctx := context.Background()
	_, err := pool.Exec(ctx, `CREATE FUNCTION `+table+`_conflict() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM pg_sleep(0.2); RAISE EXCEPTION 'forced' USING ERRCODE = '40001'; END $$;
CREATE TRIGGER conflict BEFORE UPDATE ON `+table+` FOR EACH ROW EXECUTE FUNCTION `+table+`_conflict();`)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP FUNCTION IF EXISTS "+table+"_conflict CASCADE") })
	rec := backend.Record{Key: "k", Token: "t", State: backend.StatePending}
	_, won, err := b.Claim(ctx, rec, time.Now(), time.Minute)
	require.NoError(t, err)
	require.True(t, won)

	tctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond) // the second attempt, 200 ms in, is cut at 300
	defer cancel()
	err = b.Complete(tctx, rec, time.Now(), time.Hour)
	require.Error(t, err)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.True(t, conflicted(err), "the conflict is kept: %v", err)
}
