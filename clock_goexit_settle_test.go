package idem_test

import (
	"context"
	"errors"
	"log/slog"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemtest"
)

// A clock (Options.Now) that ends the goroutine (runtime.Goexit) each
// time it is read while an execution's outcome is being kept, in a store
// without a Backend, still leaves the key settled: later calls replay the
// outcome rather than wait for ever, and Close returns.
func TestClockThatEndsTheSettlingGoroutineLeavesTheKeySettled(t *testing.T) {
	for _, how := range []string{"Goexit", "panic"} {
		t.Run(how, func(t *testing.T) {
			var sick atomic.Bool
			now := func() time.Time {
				if sick.Load() {
					if how == "panic" {
						panic("the clock broke")
					}
					runtime.Goexit()
				}
				return time.Now()
			}
			s := idem.New[int](idem.Options{Now: now, Logger: slog.New(slog.DiscardHandler)})
			runToEnd(t, func() {
				_, _ = s.RunOnce(context.Background(), "k", "p", func(context.Context) (int, error) {
					sick.Store(true) // from here on, every read of the clock ends the goroutine
					return 7, nil
				})
			})
			sick.Store(false)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			got, err := s.RunOnce(ctx, "k", "p", func(context.Context) (int, error) { return 8, nil })
			if err != nil {
				t.Fatalf("the key after its execution's clock ended the goroutine: %v", err)
			}
			if got != 7 {
				t.Fatalf("got %d, want the kept outcome 7 (the system clock answers for one that ended the goroutine)", got)
			}
			closeWithin(t, s, 5*time.Second)
		})
	}
}

// So too with a Backend, with Resume: the clock ends the goroutine on
// every read from the moment fn returns, after a step, with a final
// outcome or a failure before commit; the key is not left in flight here.
func TestClockThatEndsTheSettlingGoroutineLeavesADurableKeySettled(t *testing.T) {
	for _, final := range []bool{true, false} {
		t.Run(map[bool]string{true: "final", false: "transient"}[final], func(t *testing.T) {
			var sick atomic.Bool
			now := func() time.Time {
				if sick.Load() {
					runtime.Goexit()
				}
				return time.Now()
			}
			s := idem.New[int](idem.Options{Backend: idemtest.NewMemoryBackend(), Resume: true, Now: now,
				Lease: time.Second, SettleTimeout: 100 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
			runToEnd(t, func() {
				_, _ = s.RunOnce(context.Background(), "k", "p", func(ctx context.Context) (int, error) {
					if _, err := idem.Step(ctx, "a", func(context.Context) (int, error) { return 1, nil }); err != nil {
						t.Error(err)
					}
					sick.Store(true)
					if final {
						return 7, nil
					}
					return 0, errors.New("transient")
				})
			})
			sick.Store(false)
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			_, err := s.RunOnce(ctx, "k", "p", func(context.Context) (int, error) { return 8, nil })
			if errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("the key after its execution's clock ended the goroutine: %v", err)
			}
			closeWithin(t, s, 5*time.Second)
		})
	}
}
