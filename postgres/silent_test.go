package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/internal/faulttest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A Store over a PostgreSQL server that accepts connections and never
// answers returns when the caller's ctx ends, not after the store's
// SettleTimeout more (issue 18: a 1 s ctx returned after about 11 s, the
// claim's read-back running under SettleTimeout in the caller's
// goroutine). Needs no database: the server is a silent listener.
func TestStoreOverSilentServer(t *testing.T) {
	pool, err := pgxpool.New(context.Background(), "postgres://postgres@"+faulttest.SilentServer(t)+"/test?sslmode=disable")
	require.NoError(t, err) // connections are made lazily
	t.Cleanup(pool.Close)
	b, err := New(context.Background(), pool, Options{NoMigrate: true})
	require.NoError(t, err)
	s := idem.New[int](idem.Options{Backend: b, SettleTimeout: 2 * time.Second})
	defer s.Close()

	const wait = time.Second
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	start := time.Now()
	_, err = s.RunOnce(ctx, "k", "p", func(context.Context) (int, error) { return 1, nil })
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Less(t, time.Since(start), wait+700*time.Millisecond, "the caller waited past its ctx")
}
