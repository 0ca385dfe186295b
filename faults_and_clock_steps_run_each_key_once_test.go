package idem_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemtest"
)

// Two stores share a backend whose calls fail or lose their replies at
// random, under a clock that steps both ways, while callers of RunOnce
// and Begin leave at random and fn succeeds, fails, panics or ends its
// goroutine: no key's fn runs twice at once nor after a caller was told
// it succeeded, every call returns an error of a documented kind (or fn's
// own), and once both stores are closed no goroutine of theirs is left.
func TestFaultsAndClockStepsRunEachKeyOnceAndLeakNothing(t *testing.T) {
	base := runtime.NumGoroutine()
	var faults atomic.Bool
	faults.Store(true)
	flaky := func(string) error {
		if faults.Load() && rand.IntN(20) == 0 {
			return errLost
		}
		return nil
	}
	b := idemtest.Faulty{Backend: idemtest.NewMemoryBackend(), Fail: flaky, Lose: flaky}
	var skew atomic.Int64
	now := func() time.Time {
		if rand.IntN(10) == 0 {
			skew.Add(int64(rand.IntN(21)-10) * int64(time.Second))
		}
		return time.Now().Add(time.Duration(skew.Load()))
	}
	opts := idem.Options{Backend: b, Lease: 2 * time.Second, SettleTimeout: 200 * time.Millisecond, Now: now}
	stores := []*idem.Store[int]{idem.New[int](opts), nil}
	opts.RetryInterrupted = true
	stores[1] = idem.New[int](opts)

	errTransient := errors.New("transient")
	var running, succeeded sync.Map // key -> *atomic.Int32, *atomic.Bool
	start := time.Now()
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Since(start) < 1500*time.Millisecond {
				// A fresh set of keys every 20 ms, so that fn keeps running.
				key := fmt.Sprintf("k%d-%d", rand.IntN(4), time.Since(start)/(20*time.Millisecond))
				rv, _ := running.LoadOrStore(key, new(atomic.Int32))
				sv, _ := succeeded.LoadOrStore(key, new(atomic.Bool))
				runs, done := rv.(*atomic.Int32), sv.(*atomic.Bool)
				fn := func(context.Context) (int, error) {
					if runs.Add(1) != 1 {
						t.Errorf("%s: fn ran twice at once", key)
					}
					defer runs.Add(-1)
					if done.Load() {
						t.Errorf("%s: fn ran after a caller was told it succeeded", key)
					}
					switch rand.IntN(6) {
					case 0:
						panic("fn panicked")
					case 1:
						return 0, errTransient
					case 2:
						runtime.Goexit()
					}
					return 1, nil
				}
				ctx, cancel := context.WithCancel(context.Background())
				if rand.IntN(4) == 0 {
					go cancel()
				}
				s := stores[rand.IntN(2)]
				err := errors.New("the calling goroutine ended")
				called := make(chan struct{})
				go func() {
					defer close(called)
					if rand.IntN(2) == 0 {
						_, err = s.RunOnce(ctx, key, "p", fn)
						return
					}
					tk, berr := s.Begin(ctx, key, "p")
					if berr != nil {
						err = berr
						return
					}
					if tk.Replayed() {
						_, err = tk.Result()
						return
					}
					defer tk.Release()
					_, err = tk.Do(fn)
				}()
				<-called
				cancel()
				var pe *idem.PanicError
				var be *idem.BackendError
				switch {
				case err == nil:
					done.Store(true)
				case errors.As(err, &pe), errors.As(err, &be), errors.Is(err, idem.ErrInProgress),
					errors.Is(err, idem.ErrOutcomeUnknown), errors.Is(err, errTransient),
					errors.Is(err, context.Canceled), err.Error() == "the calling goroutine ended",
					err.Error() == "idem: fn called runtime.Goexit":
				default:
					t.Errorf("%s: an error of no documented kind: %v", key, err)
				}
			}
		}()
	}
	wg.Wait()
	faults.Store(false)
	for _, s := range stores {
		_ = s.Shutdown(context.Background()) // what it left is its report, not a failure here
	}
	waitFor(t, func() bool { return runtime.NumGoroutine() <= base }, "the stores' goroutines to end after Close")
}
