package idem_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A claim that fails at once but lands later (a request delayed on a
// connection the client gave up on) is released when it shows up: the key
// is not left to turn interrupted, and fn runs once.
func TestLateClaimIsReleased(t *testing.T) {
	mem := idemtest.NewMemoryBackend()
	landed := make(chan struct{})
	b := hooked{Backend: mem, claim: func(ctx context.Context, rec backend.Record, now time.Time, lease time.Duration) (backend.Record, bool, error) {
		go func() { // the request arrives after its caller gave up
			defer close(landed)
			time.Sleep(50 * time.Millisecond) // network delay, not ordering
			_, _, _ = mem.Claim(context.Background(), rec, time.Now(), lease)
		}()
		return backend.Record{}, false, context.DeadlineExceeded
	}}
	s := durableStore(t, b, idem.Options{Lease: time.Hour})
	calls, fn := countingFn(order{1, 1})
	_, err := s.RunOnce(context.Background(), "k", "p", fn)
	var be *idem.BackendError
	require.ErrorAs(t, err, &be)
	<-landed // a goroutine of this test's, that sleeps 50 ms
	waitFor(t, absent(mem, "k"), "the late claim is released")
	other := durableStore(t, mem, idem.Options{})
	v, err := other.RunOnce(context.Background(), "k", "p", fn)
	require.NoError(t, err)
	assert.Equal(t, order{1, 1}, v)
	assert.Equal(t, int32(1), calls.Load())
}

// A claim whose reply arrives after its lease could have lapsed does not
// run fn: another store may already have taken the key for interrupted.
func TestClaimReplyPastTheLeaseRunsNothing(t *testing.T) {
	mem := idemtest.NewMemoryBackend()
	const lease = 100 * time.Millisecond
	b := hooked{Backend: mem, claim: func(ctx context.Context, rec backend.Record, now time.Time, lease time.Duration) (backend.Record, bool, error) {
		got, won, err := mem.Claim(ctx, rec, now, lease)
		time.Sleep(lease) // a reply slower than the lease
		return got, won, err
	}}
	s := durableStore(t, b, idem.Options{Lease: lease})
	calls, fn := countingFn(order{2, 2})
	_, err := s.RunOnce(context.Background(), "k", "p", fn)
	var be *idem.BackendError
	require.ErrorAs(t, err, &be)
	assert.Zero(t, calls.Load(), "fn ran on a lease that could have lapsed")
	waitFor(t, absent(mem, "k"), "the untrusted claim is released")
}

// fn's context ends when the trusted lease runs out, even while a renewal
// call hangs and ignores its context.
func TestLeaseTrustEndsWhileRenewalHangs(t *testing.T) {
	unblock := make(chan struct{})
	var renewing atomic.Int32
	b := hooked{Backend: idemtest.NewMemoryBackend(), renew: func(context.Context) error {
		renewing.Add(1)
		defer renewing.Add(-1)
		<-unblock // a client that ignores its context deadline
		return errors.New("timed out")
	}}
	// Trust ends at 0.9 lease: lease/10 of slack for a loaded machine to
	// wake fn before the deadline the assertion checks.
	const lease = 2 * time.Second
	s := durableStore(t, b, idem.Options{Lease: lease})
	var cause error
	var took time.Duration
	start := time.Now()
	_, _ = s.RunOnce(context.Background(), "k", "p", func(ctx context.Context) (order, error) {
		select {
		case <-ctx.Done():
		case <-time.After(10 * lease): // fails below rather than hangs
		}
		took, cause = time.Since(start), context.Cause(ctx)
		close(unblock)
		return order{}, errors.New("gave up")
	})
	assert.ErrorIs(t, cause, idem.ErrLeaseLost)
	assert.Less(t, took, lease, "the owner must stop trusting its lease before the backend could lapse it")
}

// The lease is renewed while the outcome is being recorded: an owner whose
// outcome write takes longer than the lease is not taken for interrupted.
func TestLeaseRenewedWhileRecording(t *testing.T) {
	mem := idemtest.NewMemoryBackend()
	const lease = 600 * time.Millisecond
	var failUntil atomic.Int64
	b := idemtest.Faulty{Backend: mem, Fail: func(op string) error {
		if op == "Complete" && time.Now().UnixNano() < failUntil.Load() {
			return errors.New("connection reset")
		}
		return nil
	}}
	s := durableStore(t, b, idem.Options{Lease: lease})
	other := durableStore(t, mem, idem.Options{RetryInterrupted: true})
	var calls atomic.Int32
	var sawPending atomic.Bool
	v, err := s.RunOnce(context.Background(), "k", "p", func(context.Context) (order, error) {
		calls.Add(1)
		failUntil.Store(time.Now().Add(3 * lease).UnixNano())
		go func() { // while the owner retries its outcome, another store asks
			time.Sleep(2 * lease) // past the first lease, not ordering
			ctx, cancel := context.WithTimeout(context.Background(), lease/3)
			defer cancel()
			_, err := other.RunOnce(ctx, "k", "p", func(context.Context) (order, error) { calls.Add(1); return order{}, nil })
			sawPending.Store(errors.Is(err, idem.ErrInProgress))
		}()
		return order{3, 3}, nil
	})
	require.NoError(t, err, "the outcome was recorded once the backend took it")
	assert.Equal(t, order{3, 3}, v)
	waitFor(t, sawPending.Load, "the other store found the key in progress")
	assert.Equal(t, int32(1), calls.Load(), "the key was taken over while its owner was recording")
}

// Close does not wait on a backend that stopped answering a poll for a key
// held elsewhere.
func TestCloseDoesNotWaitOnAHungPoll(t *testing.T) {
	mem := idemtest.NewMemoryBackend()
	_, _, err := mem.Claim(context.Background(), backend.Record{Key: "k", Fingerprint: mustFingerprint(t, "p"), Token: "elsewhere"}, time.Now(), time.Hour)
	require.NoError(t, err)
	polling := make(chan struct{}, 1)
	b := hooked{Backend: mem, get: func(ctx context.Context) error {
		select {
		case polling <- struct{}{}:
		default:
		}
		<-ctx.Done() // hangs until its context ends
		return ctx.Err()
	}}
	s := idem.New[order](idem.Options{Backend: b})
	// A caller that cannot leave polls on its own goroutine until Close.
	ran := make(chan error, 1)
	go func() {
		_, err := s.RunOnce(context.Background(), "k", "p", func(context.Context) (order, error) { return order{}, nil })
		ran <- err
	}()
	select {
	case <-polling:
	case <-time.After(10 * time.Second):
		t.Fatal("the store never polled the key")
	}
	closed := make(chan struct{})
	go func() { _ = s.Close(); close(closed) }()
	select {
	case err := <-ran:
		assert.ErrorIs(t, err, idem.ErrInProgress, "a poll ended by Close")
	case <-time.After(10 * time.Second):
		t.Fatal("Close left a caller polling")
	}
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close waited on a poll that the backend never answers")
	}
}

// A renewal in flight when the execution ends is waited for by Close, and
// ended by it: nothing calls the backend after Close returns.
func TestCloseEndsRenewalInFlight(t *testing.T) {
	var inFlight atomic.Int32
	started := make(chan struct{}, 1)
	b := hooked{Backend: idemtest.NewMemoryBackend(), renew: func(ctx context.Context) error {
		inFlight.Add(1)
		defer inFlight.Add(-1)
		select {
		case started <- struct{}{}:
		default:
		}
		<-ctx.Done()
		return ctx.Err()
	}}
	s := idem.New[order](idem.Options{Backend: b, Lease: 3 * time.Second})
	_, err := s.RunOnce(context.Background(), "k", "p", func(context.Context) (order, error) {
		select { // a renewal is in flight when fn returns
		case <-started:
		case <-time.After(10 * time.Second):
			t.Error("no renewal started")
		}
		return order{4, 4}, nil
	})
	require.NoError(t, err)
	require.NoError(t, s.Close())
	assert.Zero(t, inFlight.Load(), "a renewal still calls the backend after Close returned")
}

// A renewal call that hangs is bounded so that a retry on a fresh
// connection still lands in time: one hung call does not cost the lease.
func TestOneHungRenewalKeepsTheLease(t *testing.T) {
	var first atomic.Bool
	b := hooked{Backend: idemtest.NewMemoryBackend(), renew: func(ctx context.Context) error {
		if first.CompareAndSwap(false, true) {
			<-ctx.Done() // the first call hangs until its own timeout
			return ctx.Err()
		}
		return nil
	}}
	// The hung call gives up at 2/3 lease, its retry goes out at 3/4 and
	// trust ends at 0.9: the lease is long enough that the slack between
	// them covers a loaded machine's timer delays.
	const lease = 1500 * time.Millisecond
	s := durableStore(t, b, idem.Options{Lease: lease})
	var cause error
	_, err := s.RunOnce(context.Background(), "k", "p", func(ctx context.Context) (order, error) {
		select {
		case <-ctx.Done():
		case <-time.After(2 * lease):
		}
		cause = context.Cause(ctx)
		return order{5, 5}, nil
	})
	require.NoError(t, err)
	assert.NoError(t, cause, "a retried renewal should have kept the lease")
}

// A claim reply that arrives late, but while its lease is still trusted,
// is renewed from when the claim was sent: fn keeps its lease.
func TestLateClaimReplyIsRenewedInTime(t *testing.T) {
	mem := idemtest.NewMemoryBackend()
	const lease = 1500 * time.Millisecond // the reply's delay leaves 0.3 lease of slack before trust ends
	var renewals atomic.Int32
	b := hooked{Backend: mem,
		claim: func(ctx context.Context, rec backend.Record, now time.Time, lease time.Duration) (backend.Record, bool, error) {
			got, won, err := mem.Claim(ctx, rec, now, lease)
			time.Sleep(lease * 6 / 10) // a slow reply, not ordering
			return got, won, err
		},
		renew: func(context.Context) error { renewals.Add(1); return nil },
	}
	s := durableStore(t, b, idem.Options{Lease: lease})
	var cause error
	_, err := s.RunOnce(context.Background(), "k", "p", func(ctx context.Context) (order, error) {
		select {
		case <-ctx.Done():
		case <-time.After(lease):
		}
		cause = context.Cause(ctx)
		return order{6, 6}, nil
	})
	require.NoError(t, err)
	assert.NoError(t, cause, "the lease was given up although renewals would have held it")
	assert.NotZero(t, renewals.Load())
}

// Once the lease is no longer trusted, failing renewals are retried at a
// bounded rate, not in a tight loop.
func TestFailingRenewalsAreRateLimited(t *testing.T) {
	var calls atomic.Int32
	b := hooked{Backend: idemtest.NewMemoryBackend(), renew: func(context.Context) error {
		calls.Add(1)
		return errors.New("connection refused")
	}}
	const lease = 120 * time.Millisecond
	s := durableStore(t, b, idem.Options{Lease: lease})
	var during int32
	_, _ = s.RunOnce(context.Background(), "k", "p", func(ctx context.Context) (order, error) {
		select {
		case <-ctx.Done():
		case <-time.After(10 * lease):
		}
		before := calls.Load()
		time.Sleep(6 * lease) // fn goes on past its trust, as fns may
		during = calls.Load() - before
		return order{}, errors.New("gave up")
	})
	assert.LessOrEqual(t, during, int32(6*12+2), "renewals retried faster than a twelfth of the lease")
}
