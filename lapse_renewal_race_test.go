package idem_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// heldRenewal is a MemoryBackend whose first renewal (not a lapse) is held
// up, announced on entered, until release is closed; landed is closed
// once it has landed.
type heldRenewal struct {
	*idemtest.MemoryBackend
	once                     sync.Once
	entered, release, landed chan struct{}
}

func (h *heldRenewal) Renew(ctx context.Context, key, token string, now time.Time, lease time.Duration) error {
	if lease > time.Nanosecond {
		first := false
		h.once.Do(func() { first = true })
		if first {
			close(h.entered)
			<-h.release
			defer close(h.landed)
		}
	}
	return h.MemoryBackend.Renew(ctx, key, token, now, lease)
}

// With Resume, a run that fails before commit after a step makes its
// claim's lease lapse, so that the next call resumes it at once. A renewal
// in flight as the run ended lands after that lapse and gives the claim
// back a whole lease that nobody renews: the next call must still resume
// it well within a lease, not wait the lease out and then watch it for
// another.
func TestRenewalInFlightDoesNotUndoALapse(t *testing.T) {
	const lease = 2 * time.Second
	h := &heldRenewal{MemoryBackend: idemtest.NewMemoryBackend(), entered: make(chan struct{}), release: make(chan struct{}), landed: make(chan struct{})}
	var b backend.Stepper = h
	s := idem.New[string](idem.Options{Backend: b, Resume: true, Lease: lease, Logger: slog.New(slog.DiscardHandler)})
	defer closeWithin(t, s, 10*time.Second)
	boom := errors.New("before commit")
	_, err := s.RunOnce(context.Background(), "k", "p", func(ctx context.Context) (string, error) {
		if _, err := idem.Step(ctx, "a", func(context.Context) (int, error) { return 7, nil }); err != nil {
			return "", err
		}
		<-h.entered // a renewal is in flight
		return "", boom
	})
	require.ErrorIs(t, err, boom)
	close(h.release) // it lands after the lapse
	<-h.landed

	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	v, err := s.RunOnce(ctx, "k", "p", func(ctx context.Context) (string, error) {
		n, err := idem.Step(ctx, "a", func(context.Context) (int, error) { return 1, nil })
		if n != 7 {
			return "", errors.New("step a ran again")
		}
		return "resumed", err
	})
	require.NoError(t, err)
	assert.Equal(t, "resumed", v)
	assert.Less(t, time.Since(start), lease, "the next call waited out the lease a late renewal gave back")
}
