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

type order struct {
	ID     int
	Amount int
}

// durableStore returns a store over b that is closed when the test ends.
func durableStore(t *testing.T, b backend.Backend, opts idem.Options) *idem.Store[order] {
	t.Helper()
	opts.Backend = b
	s := idem.New[order](opts)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func countingFn(v order) (*atomic.Int32, func(context.Context) (order, error)) {
	var calls atomic.Int32
	return &calls, func(context.Context) (order, error) {
		calls.Add(1)
		return v, nil
	}
}

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

func mustFingerprint(t *testing.T, payload any) idem.Fingerprint {
	t.Helper()
	fp, err := idem.DefaultFingerprint(payload)
	require.NoError(t, err)
	return fp
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
