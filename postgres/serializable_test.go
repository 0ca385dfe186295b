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
