package idem_test

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/stretchr/testify/assert"
)

// Three stores (plain, RetryInterrupted, Resume) share a backend and one
// clock, which steps forward or back by up to three hours before every
// call any of them makes to the backend: during claims, renewals,
// completes, the polls of waiters, takeovers. Every owner is alive and
// reaches the backend. Each key's fn runs once, never twice at once, and
// every caller gets its answer.
func TestClockStepsAtEveryCallRunEachKeyOnce(t *testing.T) {
	const lease = 200 * time.Millisecond
	clock := idemtest.NewClock(time.Now().UTC().Truncate(time.Second))
	mem := idemtest.NewMemoryBackend()
	var mu sync.Mutex
	rng := rand.New(rand.NewPCG(1, 2))
	step := func(string) error {
		mu.Lock()
		d := time.Duration(rng.Int64N(int64(6*time.Hour))) - 3*time.Hour
		mu.Unlock()
		clock.Advance(d)
		return nil
	}
	quiet := slog.New(slog.DiscardHandler)
	var stores []*idem.Store[string]
	for _, mode := range []string{"plain", "RetryInterrupted", "Resume"} {
		o := idem.Options{Backend: idemtest.Faulty{Backend: mem, Fail: step}, Now: clock.Now, Lease: lease, Logger: quiet}
		o.RetryInterrupted = mode == "RetryInterrupted"
		o.Resume = mode == "Resume"
		s := idem.New[string](o)
		defer closeWithin(t, s, 10*time.Second)
		stores = append(stores, s)
	}
	const keys, callers = 4, 3
	var runs, active [keys]atomic.Int64
	var overlapped atomic.Bool
	var wg sync.WaitGroup
	for k := range keys {
		key := fmt.Sprintf("k%d", k)
		for _, s := range stores {
			for range callers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
					defer cancel()
					v, err := s.RunOnce(ctx, key, "p", func(ctx context.Context) (string, error) {
						runs[k].Add(1)
						if active[k].Add(1) > 1 {
							overlapped.Store(true)
						}
						defer active[k].Add(-1)
						// The work outlasts several leases: renewals and
						// watches happen while it runs.
						select {
						case <-time.After(3 * lease):
						case <-ctx.Done():
							return "", context.Cause(ctx)
						}
						return "done " + key, nil
					})
					if err != nil {
						t.Errorf("%s: %v", key, err)
					} else if v != "done "+key {
						t.Errorf("%s: got %q", key, v)
					}
				}()
			}
		}
	}
	wg.Wait()
	assert.False(t, overlapped.Load(), "a key's fn ran twice at once")
	for k := range keys {
		assert.Equal(t, int64(1), runs[k].Load(), "key k%d ran %d times", k, runs[k].Load())
	}
}

// As TestClockStepsAtEveryCallRunEachKeyOnce, but a third of all renewals
// fail (a flaky link) and a few replies are lost after their write
// landed, with steps recorded: an owner may lose its claim and another
// run it again, but never while the first still runs under a live
// context (fn honours it), and every caller gets an answer or an error.
func TestClockStepsAndLostRenewalsNeverOverlapALiveOwner(t *testing.T) {
	const lease = 200 * time.Millisecond
	clock := idemtest.NewClock(time.Now().UTC().Truncate(time.Second))
	mem := idemtest.NewMemoryBackend()
	var mu sync.Mutex
	rng := rand.New(rand.NewPCG(3, 4))
	chance := func(n int64) bool {
		mu.Lock()
		defer mu.Unlock()
		return rng.Int64N(n) == 0
	}
	fail := func(op string) error {
		mu.Lock()
		d := time.Duration(rng.Int64N(int64(6*time.Hour))) - 3*time.Hour
		mu.Unlock()
		clock.Advance(d)
		if op == "Renew" && chance(3) {
			return errLost
		}
		return nil
	}
	lose := func(op string) error {
		if op != "Renew" && op != "Get" && chance(10) {
			return errLost
		}
		return nil
	}
	quiet := slog.New(slog.DiscardHandler)
	var stores []*idem.Store[string]
	for _, mode := range []string{"plain", "RetryInterrupted", "Resume"} {
		o := idem.Options{Backend: idemtest.Faulty{Backend: mem, Fail: fail, Lose: lose}, Now: clock.Now, Lease: lease, SettleTimeout: time.Second, Logger: quiet}
		o.RetryInterrupted = mode == "RetryInterrupted"
		o.Resume = mode == "Resume"
		s := idem.New[string](o)
		defer closeWithin(t, s, 10*time.Second)
		stores = append(stores, s)
	}
	const keys, callers = 4, 3
	var running [keys]struct {
		sync.Mutex
		ctxs []context.Context
	}
	var overlapped atomic.Bool
	var wg sync.WaitGroup
	for k := range keys {
		key := fmt.Sprintf("k%d", k)
		for _, s := range stores {
			for range callers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
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
						case <-time.After(3 * lease):
						case <-ctx.Done():
							return "", context.Cause(ctx)
						}
						return "done " + key, nil
					})
				}()
			}
		}
	}
	wg.Wait()
	assert.False(t, overlapped.Load(), "a key's fn started while another run of it went on under a live context")
}
