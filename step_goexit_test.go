package idem_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A Backend whose RecordStep panics or ends the goroutine (runtime.Goexit)
// after the step landed: the step's effect is done and recorded, but the
// run cannot know it. The run fails before commit; its claim must be kept
// at its recovery point, not released with the step in it, so that the
// next call resumes it and does not do the step's effect again.
func TestRecordStepThatPanicsOrExitsKeepsTheStep(t *testing.T) {
	for _, how := range []string{"panic", "goexit"} {
		t.Run(how, func(t *testing.T) {
			mem := idemtest.NewMemoryBackend()
			var armed atomic.Bool
			armed.Store(true)
			b := idemtest.Faulty{Backend: mem, Lose: func(op string) error {
				if op == "RecordStep" && armed.CompareAndSwap(true, false) {
					misbehave(how, op)
				}
				return nil
			}}
			s := idem.New[string](idem.Options{Backend: b, Resume: true, Lease: time.Hour, SettleTimeout: time.Second, Logger: slog.New(slog.DiscardHandler)})
			defer closeWithin(t, s, 5*time.Second)
			var charges atomic.Int64
			run := func(ctx context.Context) (string, error) {
				n, err := idem.Step(ctx, "charge", func(context.Context) (int64, error) { return charges.Add(1), nil })
				if err != nil {
					return "", err
				}
				return fmt.Sprint("charge ", n), nil
			}
			escaped, _ := isolated(func() { _, _ = s.RunOnce(context.Background(), "k", "p", run) })
			require.Nil(t, escaped)

			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			v, err := s.RunOnce(ctx, "k", "p", run)
			require.NoError(t, err)
			assert.Equal(t, "charge 1", v)
			assert.Equal(t, int64(1), charges.Load(), "the step's effect was done again")
		})
	}
}

// A RecordStep whose reply is lost after the step landed, while the
// read-back fails too until the settle timeout runs out: the step's fate
// is unknown, and the failed run must keep its claim at its recovery
// point rather than release the step it may hold.
func TestRecordStepOfUnknownFateKeepsTheStep(t *testing.T) {
	mem := idemtest.NewMemoryBackend()
	var outage atomic.Bool
	b := idemtest.Faulty{Backend: mem,
		Fail: func(op string) error {
			if op == "Get" && outage.Load() {
				return errLost
			}
			return nil
		},
		Lose: func(op string) error {
			if op == "RecordStep" && outage.Load() {
				return errLost
			}
			return nil
		}}
	s := idem.New[string](idem.Options{Backend: b, Resume: true, Lease: time.Hour, SettleTimeout: 50 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	defer closeWithin(t, s, 5*time.Second)
	var charges atomic.Int64
	run := func(ctx context.Context) (string, error) {
		n, err := idem.Step(ctx, "charge", func(context.Context) (int64, error) { return charges.Add(1), nil })
		if err != nil {
			return "", err
		}
		return fmt.Sprint("charge ", n), nil
	}
	outage.Store(true)
	_, err := s.RunOnce(context.Background(), "k", "p", run)
	require.Error(t, err, "the step's record could not be confirmed")
	outage.Store(false)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	v, err := s.RunOnce(ctx, "k", "p", run)
	require.NoError(t, err)
	assert.Equal(t, "charge 1", v)
	assert.Equal(t, int64(1), charges.Load(), "the step's effect was done again")
}

// A key at a recovery point (step "a" recorded, then an ordinary error)
// keeps it whatever the Observer does: runtime.Goexit in its Span, where
// the library promises to settle the key as if the work had failed before
// commit, must not delete the record and its steps. The Goexit guards
// (for "idem.execute" and "idem.record") keep the claim at its recovery
// point rather than release it with Backend.Release, which would drop the
// recorded steps and let the next call run step "a" (the charge) again.
func TestGoexitInSpanKeepsRecoveryPoint(t *testing.T) {
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
			runToEnd(t, func() { _, _ = observed.RunOnce(ctx, "k", "p", fn) })
			require.True(t, exited.Load(), "the Observer's Span was not called for %s", phase)

			// Run 3: the recovery point must still be there; step "a" is
			// replayed, not run again.
			runToEnd(t, func() { _, _ = plain.RunOnce(ctx, "k", "p", fn) })
			require.Equal(t, int32(1), charges.Load(), "step \"a\" ran again: the Goexit guard released the recovery point (its recorded steps)")
		})
	}
}
