package idem_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A key in flight through another store (another process, in production)
// is waited for, and its outcome replayed, not run again.
func TestWaitsForAnotherStore(t *testing.T) {
	b := idemtest.NewMemoryBackend()
	a, other := durableStore(t, b, idem.Options{}), durableStore(t, b, idem.Options{})
	started, release := make(chan struct{}), make(chan struct{})
	go func() {
		_, _ = a.RunOnce(context.Background(), "k", "p", func(context.Context) (order, error) {
			close(started)
			<-release
			return order{1, 450}, nil
		})
	}()
	<-started
	calls, fn := countingFn(order{2, 2})
	got := make(chan order, 1)
	go func() {
		v, err := other.RunOnce(context.Background(), "k", "p", fn)
		assert.NoError(t, err)
		got <- v
	}()
	close(release)
	assert.Equal(t, order{1, 450}, <-got)
	assert.Zero(t, calls.Load())

	// A caller that cannot wait gives up with ErrInProgress.
	started2, release2 := make(chan struct{}), make(chan struct{})
	go func() {
		_, _ = a.RunOnce(context.Background(), "k2", "p", func(context.Context) (order, error) {
			close(started2)
			<-release2
			return order{}, nil
		})
	}()
	<-started2
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	_, err := other.RunOnce(ctx, "k2", "p", fn)
	assert.ErrorIs(t, err, idem.ErrInProgress)
	close(release2)
}

// A claim whose lease ran out belongs to an owner that died: the key is
// interrupted, and RetryInterrupted takes it over.
func TestLapsedLeaseIsInterrupted(t *testing.T) {
	b := idemtest.NewMemoryBackend()
	clock := idemtest.NewClock(time.Now().UTC().Truncate(time.Second))
	ctx := context.Background()
	dead := backend.Record{Key: "k", Fingerprint: mustFingerprint(t, "p"), Token: "dead"}
	_, _, err := b.Claim(ctx, dead, clock.Now(), 30*time.Second)
	require.NoError(t, err)
	clock.Advance(time.Minute)

	calls, fn := countingFn(order{5, 5})
	// A store watches a lapsed claim for a whole Lease of its own, on its
	// own monotonic clock, before it takes it for a dead owner's: a short
	// one keeps the wait short (the default would be 30 s a store).
	const lease = time.Second
	s := durableStore(t, b, idem.Options{Now: clock.Now, Lease: lease})
	_, err = s.RunOnce(ctx, "k", "p", fn)
	assert.ErrorIs(t, err, idem.ErrOutcomeUnknown)
	retrying := durableStore(t, b, idem.Options{Now: clock.Now, RetryInterrupted: true, Lease: lease})
	v, err := retrying.RunOnce(ctx, "k", "p", fn)
	require.NoError(t, err)
	assert.Equal(t, order{5, 5}, v)
	assert.Equal(t, int32(1), calls.Load())
}

// An owner whose claim was taken over (its lease lapsed while it stalled,
// and another store re-ran the key) sees fn's context cancelled with
// ErrLeaseLost, and its outcome is refused, not written over the new one.
func TestLostLeaseIsFenced(t *testing.T) {
	mem := idemtest.NewMemoryBackend()
	ctx := context.Background()
	var once sync.Once
	b := idemtest.Faulty{Backend: mem, Fail: func(op string) error {
		if op == "Renew" {
			once.Do(func() { // the new owner takes over before the renewal lands
				old, _, _ := mem.Get(ctx, "k", time.Now())
				require.NoError(t, mem.Release(ctx, "k", old.Token))
				claim := old
				claim.Token = "new-owner"
				_, won, err := mem.Claim(ctx, claim, time.Now(), time.Minute)
				require.NoError(t, err)
				require.True(t, won)
				claim.Value = []byte(`{"ID":9,"Amount":9}`)
				require.NoError(t, mem.Complete(ctx, claim, time.Now(), time.Hour))
			})
		}
		return nil
	}}
	var un idemtest.Unrecorded
	s := durableStore(t, b, idem.Options{Lease: time.Second, Observer: un.Observer()}) // the hook takes over at the first renewal, lease/3 in
	var cause error
	v, err := s.RunOnce(ctx, "k", "p", func(ctx context.Context) (order, error) {
		<-ctx.Done()
		cause = context.Cause(ctx)
		return order{1, 1}, nil // the stale owner finishes all the same
	})
	assert.ErrorIs(t, cause, idem.ErrLeaseLost)
	require.NoError(t, err, "its work took effect: the caller is answered it")
	assert.Equal(t, order{1, 1}, v)
	assert.ErrorIs(t, un.Of("k"), backend.ErrNotOwner, "the Observer is told its outcome was refused")
	rec, _, err := mem.Get(ctx, "k", time.Now())
	require.NoError(t, err)
	assert.Equal(t, "new-owner", rec.Token)
	assert.Equal(t, `{"ID":9,"Amount":9}`, string(rec.Value), "the record keeps the new owner's outcome")
}

// A different payload is refused at once, even while the key is in flight
// in another store.
func TestMismatchWhileInFlightElsewhere(t *testing.T) {
	b := idemtest.NewMemoryBackend()
	a, other := durableStore(t, b, idem.Options{}), durableStore(t, b, idem.Options{})
	started, release := make(chan struct{}), make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = a.RunOnce(context.Background(), "k", "p", func(context.Context) (order, error) {
			close(started)
			<-release
			return order{}, nil
		})
	}()
	<-started
	_, err := other.RunOnce(context.Background(), "k", "another payload", func(context.Context) (order, error) { return order{}, nil })
	assert.ErrorIs(t, err, idem.ErrPayloadMismatch)
	close(release)
	<-done
}

// When renewals keep failing (a partition), fn learns that its lease ran
// out: past that point another store may take the key for interrupted.
func TestLeaseRunsOutUnderPartition(t *testing.T) {
	b := idemtest.Faulty{Backend: idemtest.NewMemoryBackend(), Fail: func(op string) error {
		if op == "Renew" {
			return errors.New("network partition")
		}
		return nil
	}}
	s := durableStore(t, b, idem.Options{Lease: 500 * time.Millisecond})
	var cause error
	_, _ = s.RunOnce(context.Background(), "k", "p", func(ctx context.Context) (order, error) {
		<-ctx.Done()
		cause = context.Cause(ctx)
		return order{}, errors.New("gave up")
	})
	assert.ErrorIs(t, cause, idem.ErrLeaseLost)
}
