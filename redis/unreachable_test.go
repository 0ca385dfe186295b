package redis

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/seed094d4201/idem"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A Store over a Redis whose every connection is refused answers a
// *BackendError with the connection error, not ErrInProgress, which would
// say another attempt is running (issue 18: a 3 s ctx got ErrInProgress
// after about 4 s), whether the client's default dial retries end before
// ctx (3 s) or ctx before them (500 ms).
func TestStoreOverRefusedRedis(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: refusedAddr(t)})
	t.Cleanup(func() { rdb.Close() })
	s := idem.New[int](idem.Options{Backend: New(rdb, Options{}), SettleTimeout: 100 * time.Millisecond})
	t.Cleanup(func() { _ = s.Close() })
	for _, wait := range []time.Duration{500 * time.Millisecond, 3 * time.Second} {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		start := time.Now()
		_, err := s.RunOnce(ctx, "k", "p", func(context.Context) (int, error) { return 1, nil })
		took := time.Since(start)
		cancel()
		var be *idem.BackendError
		require.ErrorAs(t, err, &be, "%v", err)
		assert.ErrorIs(t, err, syscall.ECONNREFUSED)
		assert.NotErrorIs(t, err, idem.ErrInProgress)
		assert.Less(t, took, wait+slack, "the caller waited past its ctx")
	}
}

// A Store over a Redis that accepts connections and never answers returns
// when the caller's ctx ends, not when go-redis's socket timeouts or the
// store's SettleTimeout do (issue 18: a 1 s ctx returned after about 6 s).
func TestStoreOverSilentRedis(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: silentServer(t)})
	t.Cleanup(func() { rdb.Close() })
	s := idem.New[int](idem.Options{Backend: New(rdb, Options{}), SettleTimeout: 100 * time.Millisecond})
	t.Cleanup(func() { _ = s.Close() })
	const wait = time.Second
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	start := time.Now()
	_, err := s.RunOnce(ctx, "k", "p", func(context.Context) (int, error) { return 1, nil })
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Less(t, time.Since(start), wait+slack)
}
