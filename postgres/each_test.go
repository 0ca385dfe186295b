package postgres

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/internal/svctest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A listing over a pool of one connection lets fn use the backend: each
// page's rows are closed before fn runs, so fn's Get finds the connection
// free (a listing that held its rows open waited for itself for ever).
func TestEachOnAPoolOfOne(t *testing.T) {
	testPool(t) // or skip
	cfg, err := pgxpool.ParseConfig(svctest.Postgres(t))
	require.NoError(t, err)
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	b, _ := testBackend(t, pool)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const n = 1234 // more than two pages
	for i := range n {
		_, won, err := b.Claim(ctx, backend.Record{Key: fmt.Sprintf("k%05d", i), Token: "t"}, time.Time{}, time.Hour)
		require.NoError(t, err)
		require.True(t, won)
	}
	var got []string
	require.NoError(t, b.Each(ctx, func(rec backend.Record) error {
		_, ok, err := b.Get(ctx, rec.Key, time.Time{})
		if err == nil && !ok {
			err = fmt.Errorf("key %q listed but not found", rec.Key)
		}
		got = append(got, rec.Key)
		return err
	}))
	require.Len(t, got, n)
	for i, k := range got {
		assert.Equal(t, fmt.Sprintf("k%05d", i), k)
	}
}
