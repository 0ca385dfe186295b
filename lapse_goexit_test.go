package idem_test

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// With Resume, a run that fails before commit after recording a step
// keeps its claim at its recovery point and makes its lease lapse (a
// Renew), so that the next call resumes it at once. A Backend whose Renew
// ends the goroutine there (runtime.Goexit) must not leave the claim held
// for its lease (an hour here): the lapse is tried again in the
// background.
func TestLapseThatExitsDoesNotHoldTheKey(t *testing.T) {
	mem := idemtest.NewMemoryBackend()
	var armed atomic.Bool
	b := idemtest.Faulty{Backend: mem, Fail: func(op string) error {
		if op == "Renew" && armed.CompareAndSwap(true, false) {
			misbehave("goexit", op)
		}
		return nil
	}}
	s := idem.New[string](idem.Options{Backend: b, Resume: true, Lease: time.Hour, SettleTimeout: time.Second, Logger: slog.New(slog.DiscardHandler)})
	defer closeWithin(t, s, 5*time.Second)
	boom := errors.New("before commit")
	escaped, exited := isolated(func() {
		_, _ = s.RunOnce(context.Background(), "k", "p", func(ctx context.Context) (string, error) {
			if _, err := idem.Step(ctx, "a", func(context.Context) (int, error) { return 7, nil }); err != nil {
				return "", err
			}
			armed.Store(true) // the lapse's Renew ends the goroutine
			return "", boom
		})
	})
	require.Nil(t, escaped)
	require.True(t, exited)
	require.False(t, armed.Load(), "the lapse was not tried")

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	v, err := s.RunOnce(ctx, "k", "p", func(ctx context.Context) (string, error) {
		n, err := idem.Step(ctx, "a", func(context.Context) (int, error) { return 1, nil })
		if n != 7 {
			return "", errors.New("step a ran again")
		}
		return "resumed", err
	})
	require.NoError(t, err, "the key was held by the claim whose lapse ended its goroutine")
	assert.Equal(t, "resumed", v)
}
