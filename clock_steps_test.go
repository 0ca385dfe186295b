package idem_test

import (
	"context"
	"log/slog"
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
	roll := roller(1, 2)
	step := func(string) error {
		clock.Advance(time.Duration(roll(int64(6*time.Hour))) - 3*time.Hour)
		return nil
	}
	b := idemtest.Faulty{Backend: idemtest.NewMemoryBackend(), Fail: step}
	stores := modeStores(b, idem.Options{Now: clock.Now, Lease: lease, Logger: slog.New(slog.DiscardHandler)})
	for _, s := range stores {
		defer closeWithin(t, s, 10*time.Second)
	}
	const keys, callers = 4, 3
	var runs, active [keys]atomic.Int64
	var overlapped atomic.Bool
	callEach(stores, keys, callers, func(k int, key string, s *idem.Store[string]) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		v, err := s.RunOnce(ctx, key, "p", func(ctx context.Context) (string, error) {
			runs[k].Add(1)
			if active[k].Add(1) > 1 {
				overlapped.Store(true)
			}
			defer active[k].Add(-1)
			// The work outlasts several leases: renewals and watches
			// happen while it runs.
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
	})
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
	roll := roller(3, 4)
	fail := func(op string) error {
		clock.Advance(time.Duration(roll(int64(6*time.Hour))) - 3*time.Hour)
		if op == "Renew" && roll(3) == 0 {
			return errLost
		}
		return nil
	}
	lose := func(op string) error {
		if op != "Renew" && op != "Get" && roll(10) == 0 {
			return errLost
		}
		return nil
	}
	b := idemtest.Faulty{Backend: idemtest.NewMemoryBackend(), Fail: fail, Lose: lose}
	stores := modeStores(b, idem.Options{Now: clock.Now, Lease: lease, SettleTimeout: time.Second, Logger: slog.New(slog.DiscardHandler)})
	for _, s := range stores {
		defer closeWithin(t, s, 10*time.Second)
	}
	var live liveRuns
	callEach(stores, 4, 3, func(_ int, key string, s *idem.Store[string]) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_, _ = s.RunOnce(ctx, key, "p", func(ctx context.Context) (string, error) {
			defer live.start(ctx, key)()
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
	})
	assert.False(t, live.overlapped.Load(), "a key's fn started while another run of it went on under a live context")
}
