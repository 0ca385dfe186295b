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

// A live owner's step whose effect is done when the clock steps forward
// past its lease: the backend reads the claim as lapsed, but the owner
// holds it (its token, its monotonic trust), as its Renew and Complete
// find. The step must be recorded, not refused: a refused step fails the
// run, whose claim is kept at its recovery point without the step, and
// the next call resumes it and does the step's effect again.
func TestClockStepForwardDoesNotLoseALiveOwnersStep(t *testing.T) {
	clock := idemtest.NewClock(time.Now().UTC().Truncate(time.Second))
	mem := idemtest.NewMemoryBackend()
	s := idem.New[string](idem.Options{Backend: mem, Now: clock.Now, Lease: time.Hour, Resume: true, Logger: slog.New(slog.DiscardHandler)})
	defer closeWithin(t, s, 5*time.Second)
	var charges atomic.Int64
	run := func(ctx context.Context) (string, error) {
		_, err := idem.Step(ctx, "charge", func(context.Context) (int, error) {
			if charges.Add(1) == 1 {
				clock.Advance(2 * time.Hour) // the step's effect is done; the clock steps
			}
			return 1, nil
		})
		if err != nil {
			return "", err
		}
		return "charged", nil
	}
	v, err := s.RunOnce(context.Background(), "k", "p", run)
	if err != nil { // the step was refused: the next call resumes the key
		require.False(t, errors.Is(err, idem.ErrLeaseLost), "the owner's own trust held: %v", err)
		v, err = s.RunOnce(context.Background(), "k", "p", run)
	}
	require.NoError(t, err)
	assert.Equal(t, "charged", v)
	assert.Equal(t, int64(1), charges.Load(), "the step's effect was done twice")
}
