package idem_test

import (
	"context"
	"log/slog"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/stretchr/testify/assert"
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
	roll := roller(5, 6)
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
	stores := modeStores(b, idem.Options{Now: clock.Now, Lease: lease, SettleTimeout: 100 * time.Millisecond, Logger: quiet})
	const keys = 4
	var live liveRuns
	var escaped atomic.Value
	callEach(stores, keys, 3, func(_ int, key string, s *idem.Store[string]) {
		catchEscape(&escaped, func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_, _ = s.RunOnce(ctx, key, "p", func(ctx context.Context) (string, error) {
				defer live.start(ctx, key)()
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
		})
	})
	assert.Nil(t, escaped.Load(), "a panic escaped the library")
	assert.False(t, live.overlapped.Load(), "a key's fn started while another run of it went on under a live context")
	for _, s := range stores {
		closeWithin(t, s, 10*time.Second)
	}

	// Healthy again: a fresh store reaches every key, after a dead
	// owner's lease at most.
	sick.Store(false)
	s := idem.New[string](idem.Options{Backend: mem, Now: clock.Now, Lease: lease, Resume: true, Logger: quiet})
	defer closeWithin(t, s, 10*time.Second)
	everyKeyAnswers(t, s, keys)
}
