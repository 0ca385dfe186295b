package idem_test

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Two stores share a backend with different Leases, as during a rolling
// deploy that changes Options.Lease. The owner (the longer lease) renews
// every quarter of its own lease, less often than the other store's whole
// lease. No clock steps. The other store must not take the claim it sees
// pending for its owner's, make it lapse and run fn again while the owner
// still runs: a claim the backend holds pending under a lease longer than
// the watcher's is watched for at least that lease.
func TestOwnerWithALongerLeaseIsNotTakenForDead(t *testing.T) {
	const long, short = 2 * time.Second, 200 * time.Millisecond
	mem := idemtest.NewMemoryBackend()
	quiet := slog.New(slog.DiscardHandler)
	var after atomic.Pointer[time.Time]
	seen := make(chan struct{}, 1)
	s0 := idem.New[string](idem.Options{Backend: mem, Lease: long, Logger: quiet})
	defer closeWithin(t, s0, 5*time.Second)
	s1 := idem.New[string](idem.Options{Backend: watchGets(mem, &after, seen), Lease: short, RetryInterrupted: true, Logger: quiet})
	defer closeWithin(t, s1, 5*time.Second)

	var runs atomic.Int64
	owner := make(chan context.Context, 1)
	finish := make(chan struct{})
	first := make(chan error, 1)
	go func() {
		v, err := s0.RunOnce(context.Background(), "k", "p", func(ctx context.Context) (string, error) {
			runs.Add(1)
			owner <- ctx
			select {
			case <-finish:
			case <-ctx.Done():
				return "", context.Cause(ctx)
			}
			return "first", nil
		})
		if err == nil && v != "first" {
			t.Errorf("store 0 got %q", v)
		}
		first <- err
	}()
	octx := <-owner

	// The owner finishes once store 1 has watched the key for five of its
	// own leases.
	at := time.Now().Add(5 * short)
	after.Store(&at)
	go func() {
		select {
		case <-seen:
		case <-octx.Done():
		}
		close(finish)
	}()
	var overlapped atomic.Bool
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	v, err := s1.RunOnce(ctx, "k", "p", func(context.Context) (string, error) {
		runs.Add(1)
		select {
		case <-octx.Done():
		default:
			overlapped.Store(true)
		}
		return "second", nil
	})
	require.NoError(t, err)
	assert.False(t, overlapped.Load(), "store 1 took a live owner's key: fn ran twice at once")
	assert.Equal(t, "first", v)
	assert.NoError(t, <-first)
	assert.Equal(t, int64(1), runs.Load())
}
