package idem_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemtest"
)

// A Backend that panics or ends the goroutine (runtime.Goexit) at its
// n-th call, whatever the method, after the call landed or before, for
// every n until a call makes fewer: no panic escapes, the key is not left
// stuck (once the Backend behaves it runs or replays), fn does not run
// again after its caller was told it succeeded, and Close returns.
func TestBackendThatMisbehavesAtEveryCallStrandsNothing(t *testing.T) {
	for _, how := range []string{"panic", "goexit"} {
		for _, landed := range []bool{false, true} {
			for _, leave := range []bool{false, true} {
				name := fmt.Sprintf("%s/landed=%v/callerMayLeave=%v", how, landed, leave)
				t.Run(name, func(t *testing.T) {
					for n := int64(1); ; n++ {
						if n == 100 {
							t.Fatal("a call still makes 100 Backend calls")
						}
						var calls atomic.Int64
						hit := func(op string) error {
							if calls.Add(1) == n {
								misbehave(how, op)
							}
							return nil
						}
						b := idemtest.Faulty{Backend: idemtest.NewMemoryBackend()}
						if landed {
							b.Lose = hit
						} else {
							b.Fail = hit
						}
						s := idem.New[int](idem.Options{Backend: b, Resume: true, Lease: 100 * time.Millisecond,
							SettleTimeout: 100 * time.Millisecond, SweepInterval: -1, Logger: slog.New(slog.DiscardHandler)})
						var runs atomic.Int32
						fn := func(ctx context.Context) (int, error) {
							runs.Add(1)
							if _, err := idem.Step(ctx, "a", func(context.Context) (int, error) { return 1, nil }); err != nil {
								return 0, err
							}
							return 1, nil
						}
						var err error = fmt.Errorf("the goroutine ended")
						escaped, _ := isolated(func() {
							ctx := context.Background()
							if leave {
								c, cancel := context.WithCancel(ctx)
								defer cancel()
								ctx = c
							}
							_, err = s.RunOnce(ctx, "k", "p", fn)
						})
						if escaped != nil {
							t.Fatalf("n=%d: a panic escaped: %v", n, escaped)
						}
						made := calls.Load()
						calls.Store(1 << 40) // behaves from here on
						ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
						got, err2 := s.RunOnce(ctx, "k", "p", fn)
						cancel()
						if err2 != nil || got != 1 {
							t.Fatalf("n=%d: after the Backend misbehaved (first call: %v): %d, %v", n, err, got, err2)
						}
						if err == nil && runs.Load() != 1 {
							t.Fatalf("n=%d: fn ran %d times, after a caller was told it succeeded", n, runs.Load())
						}
						closeWithin(t, s, 5*time.Second)
						if made < n {
							t.Logf("misbehaved at each of %d calls", n-1)
							return
						}
					}
				})
			}
		}
	}
}
