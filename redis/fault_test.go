package redis

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/seed094d4201/idem/internal/svctest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestUnreachableRedis(t *testing.T) {
	rdb := redis.NewUniversalClient(&redis.UniversalOptions{Addrs: []string{"127.0.0.1:1"}, MaxRetries: -1})
	defer rdb.Close()
	s := idem.New[int](idem.Options{Backend: New(rdb, Options{}), SettleTimeout: 50 * time.Millisecond})
	defer s.Close()
	var runs atomic.Int32
	_, err := s.RunOnce(context.Background(), "k", "p", func(context.Context) (int, error) { runs.Add(1); return 1, nil })
	var be *idem.BackendError
	require.ErrorAs(t, err, &be)
	assert.Equal(t, "claim", be.Op)
	assert.Contains(t, err.Error(), "127.0.0.1:1", "the cause is kept")
	assert.Zero(t, runs.Load(), "fn must not run without a claim")
}

func TestRedisClosedMidRun(t *testing.T) {
	shared := testClient(t)
	b := testBackend(t, shared)
	own := redis.NewUniversalClient(&redis.UniversalOptions{Addrs: []string{svctest.Redis(t)}})
	var un idemtest.Unrecorded
	// A short SettleTimeout: the store tries to record the outcome on a
	// closed client for that long before it tells the Observer (10 s unless told).
	s := idem.New[int](idem.Options{Observer: un.Observer(), Backend: New(own, Options{Prefix: b.prefix}), SettleTimeout: time.Second})
	defer s.Close()
	_, err := s.RunOnce(context.Background(), "k", "p", func(context.Context) (int, error) {
		own.Close() // Redis goes away while fn runs
		return 1, nil
	})
	require.NoError(t, err, "the caller is answered its success")
	require.NotNil(t, un.Of("k"), "the Observer is told the outcome was not recorded")
	rec, ok, err := b.Get(context.Background(), "k", time.Now())
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, backend.StatePending, rec.State, "nothing recorded as completed")
}
