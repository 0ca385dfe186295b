package redis

import (
	"context"
	"errors"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/stretchr/testify/require"
)

// bound runs the call on a goroutine of its own. If that call ends its
// goroutine with runtime.Goexit (a client hook that calls t.FailNow, say),
// bound's deferred send delivers the zero answer: (zero, nil), a success.
// A call that did nothing must never be reported as done.
func TestReviewBoundGoexitIsNotSuccess(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- bound0(ctx, new(dialWatch), func(context.Context) error { runtime.Goexit(); return nil })
	}()
	select {
	case err := <-done:
		require.Error(t, err, "bound reported a call that ended its goroutine (runtime.Goexit) as a success")
	case <-ctx.Done():
		t.Fatal("bound did not return")
	}
}

// exitOnScript ends the goroutine of the first script command sent once
// armed: the Complete of the outcome.
type exitOnScript struct{ armed atomic.Bool }

func (h *exitOnScript) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *exitOnScript) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *exitOnScript) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		switch cmd.Name() {
		case "eval", "evalsha":
			if h.armed.CompareAndSwap(true, false) {
				runtime.Goexit()
			}
		}
		return next(ctx, cmd)
	}
}

// Store-level: the Goexit in the hook during Complete once left the record
// pending while the store stopped renewing its lease and dropped the
// outcome from memory, so after one lease the key was interrupted (and
// with RetryInterrupted another store ran fn again). Now RunOnce answers
// the success, and if the record is still pending the store holds the
// outcome: the key replays it and fn never runs again.
func TestReviewRedisGoexitInCompleteReportsRecorded(t *testing.T) {
	rdb := testClient(t)
	h := &exitOnScript{}
	rdb.AddHook(h)
	b := testBackend(t, rdb)
	s := idem.New[string](idem.Options{Backend: b, SettleTimeout: time.Second})
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	val, err := s.RunOnce(ctx, "k", "p", func(context.Context) (string, error) {
		h.armed.Store(true)
		return "ok", nil
	})
	require.False(t, h.armed.Load(), "the hook did not fire: the test proved nothing")
	rec, found, gerr := b.Get(ctx, "k", time.Now())
	require.NoError(t, gerr)
	require.True(t, found)
	require.NoError(t, err)
	require.Equal(t, "ok", val)
	if rec.State != backend.StateCompleted {
		again, err := s.RunOnce(ctx, "k", "p", func(context.Context) (string, error) {
			return "", errors.New("fn ran again while its outcome was held unrecorded")
		})
		require.NoError(t, err)
		require.Equal(t, "ok", again, "the record is %v, yet the store does not hold the outcome", rec.State)
	}
}
