package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/internal/svctest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A fn that ends the transaction itself (misuse) commits the claim without
// an outcome. The claim's lease has lapsed already, so the key reads as
// interrupted: a later call answers ErrOutcomeUnknown at once instead of
// waiting out its ctx, and Forget frees the key (a claim with no lease was
// stranded for ever: only a manual DELETE freed it).
func TestRunOnceTxFnCommitsLeavesKeyInterrupted(t *testing.T) {
	s, pool, charges := txFixture(t)
	ctx := context.Background()
	_, err := RunOnceTx(ctx, s, "k", "p", func(ctx context.Context, tx pgx.Tx) (int, error) {
		if _, err := tx.Exec(ctx, "INSERT INTO "+charges+" (ord) VALUES (7)"); err != nil {
			return 0, err
		}
		_, err := tx.Exec(ctx, "COMMIT")
		return 1, err
	})
	require.Error(t, err, "a transaction fn ended cannot record the outcome")
	require.Equal(t, 1, count(t, pool, "SELECT count(*) FROM "+charges), "the misuse committed fn's write, with the claim")

	wait, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	start := time.Now()
	_, err = RunOnceTx(wait, s, "k", "p", func(context.Context, pgx.Tx) (int, error) { return 2, nil })
	assert.ErrorIs(t, err, idem.ErrOutcomeUnknown, "the stray claim reads as interrupted")
	assert.Less(t, time.Since(start), 5*time.Second, "answered at once, not after the caller's ctx")
	_, err = s.RunOnce(wait, "k", "p", func(context.Context) (int, error) { return 2, nil })
	assert.ErrorIs(t, err, idem.ErrOutcomeUnknown)

	require.NoError(t, s.Forget(ctx, "k"), "an operator can free the key")
	v, err := RunOnceTx(ctx, s, "k", "p", func(context.Context, pgx.Tx) (int, error) { return 3, nil })
	require.NoError(t, err)
	assert.Equal(t, 3, v)
}

// A RunOnceTx nested in another's fn, with fn's ctx, on a pool of one
// connection would wait for a second connection for ever (and Close with
// it): it is refused at once, as bolt and sqlite refuse it. So is a plain
// RunOnce there; on a larger pool, a plain RunOnce inside fn works.
func TestRunOnceTxNestedOnAPoolOfOne(t *testing.T) {
	testPool(t) // or skip
	cfg, err := pgxpool.ParseConfig(svctest.Postgres(t))
	require.NoError(t, err)
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	b, _ := testBackend(t, pool)
	s := idem.New[int](idem.Options{Backend: b})

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var nested, plain error
	v, err := RunOnceTx(ctx, s, "outer", "p", func(ctx context.Context, tx pgx.Tx) (int, error) {
		_, nested = RunOnceTx(ctx, s, "inner", "p", func(context.Context, pgx.Tx) (int, error) { return 1, nil })
		_, plain = s.RunOnce(ctx, "plain", "p", func(context.Context) (int, error) { return 1, nil })
		return 5, nil
	})
	require.NoError(t, err)
	assert.Equal(t, 5, v)
	assert.ErrorIs(t, nested, backend.ErrRefused)
	assert.ErrorIs(t, nested, errNested)
	assert.ErrorIs(t, plain, backend.ErrRefused)
	require.NoError(t, ctx.Err(), "refused at once, not at the deadline")
	require.NoError(t, s.Close())
}

func TestRunOnceTxPlainCallInsideOnALargerPool(t *testing.T) {
	s, _, _ := txFixture(t)
	ctx := context.Background()
	var inner error
	_, err := RunOnceTx(ctx, s, "outer", "p", func(ctx context.Context, tx pgx.Tx) (int, error) {
		_, inner = s.RunOnce(ctx, "plain", "p", func(context.Context) (int, error) { return 1, nil })
		return 1, nil
	})
	require.NoError(t, err)
	assert.NoError(t, inner)
}

// Two Backends (two tables) on one pool of one connection: a RunOnceTx on
// the second from inside the first's fn is refused too; the marker is the
// pool's, whose one connection fn's transaction holds.
func TestRunOnceTxNestedAcrossBackendsOnAPoolOfOne(t *testing.T) {
	testPool(t) // or skip
	cfg, err := pgxpool.ParseConfig(svctest.Postgres(t))
	require.NoError(t, err)
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	b1, _ := testBackend(t, pool)
	b2, _ := testBackend(t, pool)
	s1, s2 := idem.New[int](idem.Options{Backend: b1}), idem.New[int](idem.Options{Backend: b2})
	defer s1.Close()
	defer s2.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var nested error
	_, err = RunOnceTx(ctx, s1, "outer", "p", func(ctx context.Context, tx pgx.Tx) (int, error) {
		_, nested = RunOnceTx(ctx, s2, "inner", "p", func(context.Context, pgx.Tx) (int, error) { return 1, nil })
		return 1, nil
	})
	require.NoError(t, err)
	assert.ErrorIs(t, nested, errNested)
	require.NoError(t, ctx.Err(), "refused at once")
}
