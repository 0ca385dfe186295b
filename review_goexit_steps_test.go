package idem_test

import (
	"context"
	"errors"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/stretchr/testify/require"
)

// reviewRun runs f on a goroutine of its own (f may Goexit) and fails the
// test if it has not ended within a few seconds.
func reviewRun(t *testing.T, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("call did not return")
	}
}

// A key at a recovery point (step "a" recorded, then an ordinary error)
// keeps it whatever the Observer does: runtime.Goexit in its Span, where
// the library promises to settle the key as if the work had failed before
// commit, must not delete the record and its steps. Today the Goexit
// guards (claimExited for "idem.execute", finishExited for "idem.record")
// release the claim with Backend.Release, which drops the recorded steps:
// the next call runs step "a" (the charge) a second time.
func TestReviewGoexitInSpanKeepsRecoveryPoint(t *testing.T) {
	for _, phase := range []string{"idem.execute", "idem.record"} {
		t.Run(phase, func(t *testing.T) {
			mem := idemtest.NewMemoryBackend()
			var charges atomic.Int32
			fn := func(ctx context.Context) (string, error) {
				if _, err := idem.Step(ctx, "a", func(context.Context) (int, error) {
					charges.Add(1)
					return 1, nil
				}); err != nil {
					return "", err
				}
				return "", errors.New("transient: stop at the recovery point")
			}
			opts := idem.Options{Backend: mem, Resume: true, SettleTimeout: 100 * time.Millisecond}
			plain := idem.New[string](opts)
			defer closes(t, plain)

			// Run 1: step "a" runs and is recorded, then fn fails.
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_, err := plain.RunOnce(ctx, "k", "p", fn)
			require.Error(t, err)
			require.Equal(t, int32(1), charges.Load())

			// Run 2, through a store whose Observer ends the goroutine in
			// the Span of phase, once.
			var exited atomic.Bool
			obsOpts := opts
			obsOpts.Observer = &idem.Observer{Span: func(ctx context.Context, p, key string) (context.Context, func(error)) {
				if p == phase && exited.CompareAndSwap(false, true) {
					runtime.Goexit()
				}
				return ctx, func(error) {}
			}}
			observed := idem.New[string](obsOpts)
			defer closes(t, observed)
			reviewRun(t, func() { _, _ = observed.RunOnce(ctx, "k", "p", fn) })
			require.True(t, exited.Load(), "the Observer's Span was not called for %s", phase)

			// Run 3: the recovery point must still be there; step "a" is
			// replayed, not run again.
			reviewRun(t, func() { _, _ = plain.RunOnce(ctx, "k", "p", fn) })
			require.Equal(t, int32(1), charges.Load(), "step \"a\" ran again: the Goexit guard released the recovery point (its recorded steps)")
		})
	}
}
