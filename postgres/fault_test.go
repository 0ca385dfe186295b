package postgres

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestUnreachableDatabase(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, "postgres://postgres@127.0.0.1:1/test?connect_timeout=2")
	require.NoError(t, err) // connections are made lazily
	defer pool.Close()

	_, err = New(ctx, pool, Options{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "creating table")

	b, err := New(ctx, pool, Options{NoMigrate: true})
	require.NoError(t, err)
	s := idem.New[int](idem.Options{Backend: b, SettleTimeout: 50 * time.Millisecond}) // Close waits that long for the claim of unknown fate
	defer s.Close()
	var runs atomic.Int32
	_, err = s.RunOnce(ctx, "k", "p", func(context.Context) (int, error) { runs.Add(1); return 1, nil })
	var be *idem.BackendError
	require.ErrorAs(t, err, &be)
	assert.Equal(t, "claim", be.Op)
	assert.Contains(t, err.Error(), "127.0.0.1", "the cause is kept")
	assert.Zero(t, runs.Load(), "fn must not run without a claim")
}

func TestDatabaseClosedMidRun(t *testing.T) {
	pool := testPool(t)
	own, err := pgxpool.New(context.Background(), pool.Config().ConnString())
	require.NoError(t, err)
	b, table := testBackend(t, own)
	var un idemtest.Unrecorded
	// A short SettleTimeout: the store tries to record the outcome on a
	// closed pool for that long before it tells the Observer (10 s unless told).
	s := idem.New[int](idem.Options{Observer: un.Observer(), Backend: b, SettleTimeout: time.Second})
	defer s.Close()
	_, err = s.RunOnce(context.Background(), "k", "p", func(context.Context) (int, error) {
		own.Close() // the database goes away while fn runs
		return 1, nil
	})
	require.NoError(t, err, "the caller is answered its success")
	require.NotNil(t, un.Of("k"), "the Observer is told the outcome was not recorded")
	var state int
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT state FROM "+table+" WHERE key = 'k'").Scan(&state))
	assert.Equal(t, int(backend.StatePending), state, "nothing recorded as completed")
}
