package idem_test

import (
	"context"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/stretchr/testify/require"
)

// exitingComplete is a Backend whose first Complete ends its goroutine
// (a user's backend, or a client hook, calling t.FailNow), and that counts
// the renewals it gets once told the store is closed.
type exitingComplete struct {
	*idemtest.MemoryBackend
	exited      atomic.Bool
	closed      atomic.Bool
	lateRenewal chan struct{}
}

func (b *exitingComplete) Complete(ctx context.Context, rec backend.Record, now time.Time, ttl time.Duration) error {
	if b.exited.CompareAndSwap(false, true) {
		runtime.Goexit()
	}
	return b.MemoryBackend.Complete(ctx, rec, now, ttl)
}

func (b *exitingComplete) Renew(ctx context.Context, key, token string, now time.Time, lease time.Duration) error {
	if b.closed.Load() {
		select {
		case b.lateRenewal <- struct{}{}:
		default:
		}
	}
	return b.MemoryBackend.Renew(ctx, key, token, now, lease)
}

// runtime.Goexit in the Backend's Complete, after finishDurable took the
// lease's stop function off the ticket, leaves finishExited nothing to
// stop: the lease renewals run on for ever, past Close (the renewal
// timer's s.background.Add(1) then races and follows Close's
// background.Wait), and the key stays pending under a live lease that no
// process will ever record: stranded in flight for every other store.
func TestReviewGoexitInBackendCompleteStopsRenewals(t *testing.T) {
	b := &exitingComplete{MemoryBackend: idemtest.NewMemoryBackend(), lateRenewal: make(chan struct{}, 1)}
	lease := 30 * time.Millisecond
	s := idem.New[string](idem.Options{Backend: b, Lease: lease, SettleTimeout: 50 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	reviewRun(t, func() {
		_, _ = s.RunOnce(ctx, "k", "p", func(context.Context) (string, error) { return "ok", nil })
	})
	require.True(t, b.exited.Load())
	closes(t, s)
	b.closed.Store(true)
	select {
	case <-b.lateRenewal:
		t.Fatal("the claim's lease is still renewed after Close returned: its renewals were never stopped")
	case <-time.After(10 * lease):
	}
}
