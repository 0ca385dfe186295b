package idem_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestBackendOutcomeOutlivesStore(t *testing.T) {
	b := idemtest.NewMemoryBackend()
	calls, fn := countingFn(order{101, 450})
	ctx := context.Background()

	first := durableStore(t, b, idem.Options{})
	v, err := first.RunOnce(ctx, "k", "p", fn)
	require.NoError(t, err)
	assert.Equal(t, 0, first.Len(), "with a backend, memory holds only keys in flight")
	require.NoError(t, first.Close())

	second := durableStore(t, b, idem.Options{})
	replay, err := second.RunOnce(ctx, "k", "p", fn)
	require.NoError(t, err)
	assert.Equal(t, v, replay)
	assert.Equal(t, int32(1), calls.Load())

	_, err = second.RunOnce(ctx, "k", "other payload", fn)
	assert.ErrorIs(t, err, idem.ErrPayloadMismatch)
}

func TestBackendFinalErrorOutlivesStore(t *testing.T) {
	b := idemtest.NewMemoryBackend()
	ctx := context.Background()
	first := durableStore(t, b, idem.Options{})
	_, err := first.RunOnce(ctx, "k", "p", func(context.Context) (order, error) {
		return order{}, idem.Final(errors.New("card declined"))
	})
	require.True(t, idem.IsFinal(err))
	require.NoError(t, first.Close())

	second := durableStore(t, b, idem.Options{})
	calls, fn := countingFn(order{})
	_, err = second.RunOnce(ctx, "k", "p", fn)
	require.Error(t, err)
	assert.Equal(t, "card declined", err.Error())
	assert.True(t, idem.IsFinal(err))
	assert.Zero(t, calls.Load())
}

func TestBackendTransientErrorReleasesRecord(t *testing.T) {
	b := idemtest.NewMemoryBackend()
	s := durableStore(t, b, idem.Options{})
	_, err := s.RunOnce(context.Background(), "k", "p", func(context.Context) (order, error) {
		return order{}, errors.New("bank unreachable")
	})
	require.Error(t, err)
	assert.Zero(t, b.Len(), "a failure before commit must release the durable claim")
}

func TestBackendCoalescesToOneClaim(t *testing.T) {
	var inFlight atomic.Bool
	var claimsInFlight atomic.Int32
	b := idemtest.Faulty{Backend: idemtest.NewMemoryBackend(), Fail: func(op string) error {
		if op == "Claim" && inFlight.Load() {
			claimsInFlight.Add(1)
		}
		return nil
	}}
	s := durableStore(t, b, idem.Options{})
	const callers = 100
	arrived := make(chan struct{}, callers)
	var calls atomic.Int32
	fn := func(context.Context) (order, error) {
		inFlight.Store(true)
		defer inFlight.Store(false)
		calls.Add(1)
		for range callers { // hold the execution until every caller has set off
			<-arrived
		}
		return order{1, 1}, nil
	}
	var wg sync.WaitGroup
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			arrived <- struct{}{}
			_, err := s.RunOnce(context.Background(), "k", "p", fn)
			assert.NoError(t, err)
		}()
	}
	wg.Wait()
	assert.Equal(t, int32(1), calls.Load())
	assert.Zero(t, claimsInFlight.Load(), "duplicates in this process must wait in memory, not claim in the backend")
}

func TestInterruptedKeyIsNotRunAgain(t *testing.T) {
	b := idemtest.NewMemoryBackend()
	ctx := context.Background()
	crashed := durableStore(t, b, idem.Options{})
	started, release := make(chan struct{}), make(chan struct{})
	go func() {
		_, _ = crashed.RunOnce(ctx, "k", "p", func(context.Context) (order, error) {
			close(started)
			<-release
			return order{1, 1}, nil
		})
	}()
	<-started
	b.Crash() // the process dies while fn runs

	s := durableStore(t, b, idem.Options{})
	calls, fn := countingFn(order{2, 2})
	_, err := s.RunOnce(ctx, "k", "p", fn)
	assert.ErrorIs(t, err, idem.ErrOutcomeUnknown)
	assert.Zero(t, calls.Load(), "an interrupted key must not run again on its own")
	_, err = s.RunOnce(ctx, "k", "other", fn)
	assert.ErrorIs(t, err, idem.ErrPayloadMismatch)

	require.NoError(t, s.Forget(ctx, "k"))
	v, err := s.RunOnce(ctx, "k", "p", fn)
	require.NoError(t, err)
	assert.Equal(t, order{2, 2}, v)

	// The dead owner comes back late: its token no longer holds the key, so
	// it cannot overwrite the new outcome.
	close(release)
	require.NoError(t, crashed.Close())
	v, err = s.RunOnce(ctx, "k", "p", fn)
	require.NoError(t, err)
	assert.Equal(t, order{2, 2}, v)
	assert.Equal(t, int32(1), calls.Load())
}

func TestRetryInterruptedRunsAgain(t *testing.T) {
	b := idemtest.NewMemoryBackend()
	ctx := context.Background()
	_, _, err := b.Claim(ctx, backend.Record{Key: "k", Fingerprint: mustFingerprint(t, "p"), Token: "dead-owner"}, time.Now(), time.Minute)
	require.NoError(t, err)
	b.Crash()

	s := durableStore(t, b, idem.Options{RetryInterrupted: true})
	calls, fn := countingFn(order{3, 3})
	v, err := s.RunOnce(ctx, "k", "p", fn)
	require.NoError(t, err)
	assert.Equal(t, order{3, 3}, v)
	assert.Equal(t, int32(1), calls.Load())
	rec, _, err := b.Get(ctx, "k", time.Now())
	require.NoError(t, err)
	assert.Equal(t, backend.StateCompleted, rec.State)
}

func TestUnreachableBackend(t *testing.T) {
	down := errors.New("connection refused")
	b := idemtest.Faulty{Backend: idemtest.NewMemoryBackend(), Fail: func(string) error { return down }}
	s := durableStore(t, b, idem.Options{SettleTimeout: 50 * time.Millisecond}) // Close waits that long for the claim of unknown fate
	calls, fn := countingFn(order{})
	_, err := s.RunOnce(context.Background(), "k", "p", fn)
	assert.ErrorIs(t, err, down)
	var be *idem.BackendError
	require.ErrorAs(t, err, &be)
	assert.Equal(t, "claim", be.Op)
	assert.Zero(t, calls.Load(), "fn must not run without a durable claim")
	assert.Zero(t, s.Len())
	assert.ErrorIs(t, s.Forget(context.Background(), "k"), down)
	_, err = s.Sweep(context.Background())
	assert.ErrorIs(t, err, down)
}

func TestUnrecordedOutcomeKeepsKeyClaimed(t *testing.T) {
	mem := idemtest.NewMemoryBackend()
	full := errors.New("disk full")
	b := idemtest.Faulty{Backend: mem, Fail: func(op string) error {
		if op == "Complete" {
			return full
		}
		return nil
	}}
	clock := idemtest.NewClock(time.Now().UTC().Truncate(time.Second))
	var un idemtest.Unrecorded
	s := durableStore(t, b, idem.Options{Now: clock.Now, TTL: time.Hour, SettleTimeout: 50 * time.Millisecond, Observer: un.Observer()})
	calls, fn := countingFn(order{7, 7})
	ctx := context.Background()
	v, err := s.RunOnce(ctx, "k", "p", fn)
	assert.Equal(t, order{7, 7}, v, "the caller is told the result")
	require.NoError(t, err, "a success is answered as one, recorded or not")
	require.NotNil(t, un.Of("k"), "the Observer is told it was not recorded")
	assert.ErrorIs(t, un.Of("k"), full)

	v, err = s.RunOnce(ctx, "k", "p", fn)
	assert.Equal(t, order{7, 7}, v, "memory replays the result")
	assert.NoError(t, err)
	assert.Equal(t, int32(1), calls.Load(), "a key whose fn succeeded is never released")

	assert.ErrorIs(t, s.Forget(ctx, "k"), idem.ErrInProgress, "its record is pending under a live lease, so it cannot be forgotten yet")
	v, _ = s.RunOnce(ctx, "k", "p", fn)
	assert.Equal(t, order{7, 7}, v, "a refused Forget leaves memory as it was")

	clock.Advance(48 * time.Hour)
	v, err = s.RunOnce(ctx, "k", "p", fn)
	assert.Equal(t, order{7, 7}, v, "the unrecorded outcome is pinned: it does not expire while the store lives")
	assert.NoError(t, err)
	assert.Equal(t, int32(1), calls.Load())
	assert.Equal(t, 1, un.Count("k"), "told once, by the execution, not by each replay")

	mem.Crash() // after a restart the key is interrupted, not free
	restarted := durableStore(t, mem, idem.Options{})
	_, err = restarted.RunOnce(ctx, "k", "p", fn)
	assert.ErrorIs(t, err, idem.ErrOutcomeUnknown)
	assert.Equal(t, int32(1), calls.Load())
}

func TestBackendSweep(t *testing.T) {
	b := idemtest.NewMemoryBackend()
	clock := idemtest.NewClock(time.Now().UTC().Truncate(time.Second))
	s := durableStore(t, b, idem.Options{TTL: time.Minute, Now: clock.Now, SweepInterval: -1})
	_, fn := countingFn(order{})
	for i := range 2500 {
		_, err := s.RunOnce(context.Background(), fmt.Sprint("k", i), nil, fn)
		require.NoError(t, err)
	}
	clock.Advance(time.Minute)
	n, err := s.Sweep(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 2500, n, "Sweep must go on past one backend batch")
	assert.Zero(t, b.Len())
}

// A failure before commit whose release cannot reach the backend is not
// remembered: the claim is released in the background once the backend
// answers, and the next call runs fn again, here and in another store.
func TestUnreleasedFailureIsReleasedLater(t *testing.T) {
	mem := idemtest.NewMemoryBackend()
	var failReleases atomic.Bool
	failReleases.Store(true)
	b := idemtest.Faulty{Backend: mem, Fail: func(op string) error {
		if (op == "Release" || op == "Get") && failReleases.Load() {
			return errors.New("disk full")
		}
		return nil
	}}
	s := durableStore(t, b, idem.Options{SettleTimeout: 50 * time.Millisecond})
	declined := errors.New("bank unreachable")
	var calls atomic.Int32
	fn := func(context.Context) (order, error) { calls.Add(1); return order{}, declined }
	ctx := context.Background()
	_, err := s.RunOnce(ctx, "k", "p", fn)
	assert.ErrorIs(t, err, declined)
	assert.ErrorContains(t, err, "disk full")
	rec, ok, err := mem.Get(ctx, "k", time.Now())
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, backend.StatePending, rec.State, "the release did not get through")

	failReleases.Store(false) // the backend answers again
	bounded, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = s.RunOnce(bounded, "k", "p", fn)
	assert.ErrorIs(t, err, declined, "a transient error is never replayed")
	assert.Equal(t, int32(2), calls.Load(), "the key was released, and fn ran again")
	other := durableStore(t, mem, idem.Options{})
	_, err = other.RunOnce(bounded, "k", "p", fn)
	assert.ErrorIs(t, err, declined)
	assert.Equal(t, int32(3), calls.Load())
}
