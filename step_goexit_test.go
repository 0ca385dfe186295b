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
