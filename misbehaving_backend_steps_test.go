package idem_test

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Stores (plain, RetryInterrupted, Resume) share a backend that, at random
// in any method and on any goroutine (callers', renewals', the releaser's,
// the recorder's), panics or ends the goroutine (runtime.Goexit) before or
// after its write, loses replies, and has its clock stepped either way.
// No panic escapes, no run of a key starts while another goes on under a
// live context, and Close returns. Then, with the backend healthy, a
// store with Resume runs or replays every key.
func TestMisbehavingBackendNeverOverlapsOrStrands(t *testing.T) {
	const lease = 150 * time.Millisecond
	clock := idemtest.NewClock(time.Now().UTC().Truncate(time.Second))
	mem := idemtest.NewMemoryBackend()
	var mu sync.Mutex
	rng := rand.New(rand.NewPCG(5, 6))
	roll := func(n int64) int64 {
		mu.Lock()
		defer mu.Unlock()
		return rng.Int64N(n)
	}
	var sick atomic.Bool
	sick.Store(true)
	misbehaveAt := func(op string) error {
		if !sick.Load() {
			return nil
		}
		if roll(3) == 0 {
			clock.Advance(time.Duration(roll(int64(4*time.Hour))) - 2*time.Hour)
		}
		switch roll(40) {
		case 0:
			panic(op + " panicked")
		case 1:
			runtime.Goexit()
		case 2, 3:
			return errLost
		}
		return nil
	}
	b := idemtest.Faulty{Backend: mem, Fail: misbehaveAt, Lose: misbehaveAt}
	quiet := slog.New(slog.DiscardHandler)
	var stores []*idem.Store[string]
	for _, mode := range []string{"plain", "RetryInterrupted", "Resume"} {
		o := idem.Options{Backend: b, Now: clock.Now, Lease: lease, SettleTimeout: 100 * time.Millisecond, Logger: quiet}
		o.RetryInterrupted = mode == "RetryInterrupted"
		o.Resume = mode == "Resume"
		stores = append(stores, idem.New[string](o))
	}
	const keys, callers = 4, 3
	var running [keys]struct {
		sync.Mutex
		ctxs []context.Context
	}
	var overlapped atomic.Bool
	var escaped atomic.Value
	var wg sync.WaitGroup
	for k := range keys {
		key := fmt.Sprintf("k%d", k)
		for _, s := range stores {
			for range callers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					returned := false
					defer func() {
						if !returned {
							if v := recover(); v != nil {
								escaped.Store(fmt.Sprint(v))
							}
						}
					}()
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					defer cancel()
					_, _ = s.RunOnce(ctx, key, "p", func(ctx context.Context) (string, error) {
						r := &running[k]
						r.Lock()
						for _, other := range r.ctxs {
							if other.Err() == nil {
								overlapped.Store(true)
							}
						}
						r.ctxs = append(r.ctxs, ctx)
						r.Unlock()
						defer func() {
							r.Lock()
							r.ctxs = slices.DeleteFunc(r.ctxs, func(c context.Context) bool { return c == ctx })
							r.Unlock()
						}()
						if _, err := idem.Step(ctx, "a", func(context.Context) (int, error) { return 1, nil }); err != nil {
							return "", err
						}
						select {
						case <-time.After(lease):
						case <-ctx.Done():
							return "", context.Cause(ctx)
						}
						return "done " + key, nil
					})
					returned = true
				}()
			}
		}
	}
	wg.Wait()
	assert.Nil(t, escaped.Load(), "a panic escaped the library")
	assert.False(t, overlapped.Load(), "a key's fn started while another run of it went on under a live context")
	for _, s := range stores {
		closeWithin(t, s, 10*time.Second)
	}

	// Healthy again: a fresh store reaches every key, after a dead
	// owner's lease at most.
	sick.Store(false)
	s := idem.New[string](idem.Options{Backend: mem, Now: clock.Now, Lease: lease, Resume: true, Logger: quiet})
	defer closeWithin(t, s, 10*time.Second)
	for k := range keys {
		key := fmt.Sprintf("k%d", k)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		v, err := s.RunOnce(ctx, key, "p", func(context.Context) (string, error) { return "done " + key, nil })
		cancel()
		require.NoError(t, err, "key %s was left stuck", key)
		require.Equal(t, "done "+key, v)
	}
}
