package idem_test

import (
	"context"
	"errors"
	"log/slog"
	"runtime"
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

// A renewal refused with ErrNotOwner ends the lease's renewals: another
// owner holds the key, or it was settled. The timer that a renewal arms
// for the end of the trust must not start one more renewal under the lost
// token when it fires (the work goes on past that instant: fn is free to
// ignore its context).
func TestNoRenewalAfterNotOwner(t *testing.T) {
	var renewals atomic.Int32
	again := make(chan struct{}, 1)
	b := hooked{Backend: idemtest.NewMemoryBackend(), renew: func(context.Context) error {
		if renewals.Add(1) > 1 {
			select {
			case again <- struct{}{}:
			default:
			}
		}
		return backend.ErrNotOwner
	}}
	const lease = 300 * time.Millisecond
	s := durableStore(t, b, idem.Options{Lease: lease})
	var cause error
	_, _ = s.RunOnce(context.Background(), "k", "p", func(ctx context.Context) (order, error) {
		select {
		case <-ctx.Done():
		case <-time.After(10 * lease):
		}
		cause = context.Cause(ctx)
		// The trust that the refused renewal's timer was armed for ends
		// 0.9 lease after the claim: wait for a renewal past it, or two
		// leases without one.
		select {
		case <-again:
		case <-time.After(2 * lease):
		}
		return order{}, errors.New("gave up")
	})
	assert.ErrorIs(t, cause, idem.ErrLeaseLost)
	assert.Equal(t, int32(1), renewals.Load(), "the lease was renewed again after the backend said another owner holds it")
}

// A Backend whose Renew ends its goroutine (runtime.Goexit: a client hook,
// a test's t.FailNow) made a renewal that failed: the next is tried as
// after any failure, so the live owner keeps its claim. The renewal must
// not be left marked in flight for ever, with no renewal ever again and
// the work cancelled at the end of the trust.
func TestGoexitInRenewIsAFailedRenewal(t *testing.T) {
	var exited atomic.Bool
	var renewals atomic.Int32
	b := hooked{Backend: idemtest.NewMemoryBackend(), renew: func(context.Context) error {
		if exited.CompareAndSwap(false, true) {
			runtime.Goexit()
		}
		renewals.Add(1)
		return nil
	}}
	// The renewal that exits goes out at 1/3 lease, its retry at 1/3+1/12,
	// trust ends at 0.9: slack for a loaded machine's timers.
	const lease = 1500 * time.Millisecond
	s := durableStore(t, b, idem.Options{Lease: lease})
	var cause error
	_, err := s.RunOnce(context.Background(), "k", "p", func(ctx context.Context) (order, error) {
		select {
		case <-ctx.Done():
		case <-time.After(2 * lease):
		}
		cause = context.Cause(ctx)
		return order{7, 7}, nil
	})
	require.NoError(t, err)
	require.True(t, exited.Load(), "no renewal was made")
	assert.NoError(t, cause, "a renewal that ended its goroutine cost the live owner its lease")
	assert.NotZero(t, renewals.Load(), "no renewal was tried after the one that exited")
}

// Once renewals have failed, a retry that then hangs (a client that
// ignores its context) still cannot keep the work trusting its lease:
// the work's context ends with ErrLeaseLost before the lease could lapse.
func TestTrustEndsWhenARetriedRenewalHangs(t *testing.T) {
	unblock := make(chan struct{})
	var calls atomic.Int32
	b := hooked{Backend: idemtest.NewMemoryBackend(), renew: func(context.Context) error {
		if calls.Add(1) == 1 {
			return errors.New("connection refused") // the first fails at once
		}
		<-unblock // its retry hangs, whatever its context says
		return errors.New("timed out")
	}}
	const lease = 2 * time.Second
	s := durableStore(t, b, idem.Options{Lease: lease})
	var cause error
	var took time.Duration
	start := time.Now()
	_, _ = s.RunOnce(context.Background(), "k", "p", func(ctx context.Context) (order, error) {
		select {
		case <-ctx.Done():
		case <-time.After(10 * lease):
		}
		took, cause = time.Since(start), context.Cause(ctx)
		close(unblock)
		return order{}, errors.New("gave up")
	})
	assert.GreaterOrEqual(t, calls.Load(), int32(2), "the failed renewal was not retried")
	assert.ErrorIs(t, cause, idem.ErrLeaseLost)
	assert.Less(t, took, lease, "the owner trusted its lease past the moment the backend could lapse it")
}

// brokenCodec cannot encode any result: the store holds such an outcome in
// memory and renews its claim until the store closes (holdLease).
type brokenCodec struct{ idem.JSONCodec }

func (brokenCodec) Marshal(any) ([]byte, error) { return nil, errors.New("cannot encode") }

// Close while held claims are being renewed fast: every renewal is over
// when Close returns, none starts after it, and the WaitGroup that counts
// them is never added to while Close waits on it (run with -race).
func TestCloseEndsEveryRenewalOfHeldLeases(t *testing.T) {
	for i := 0; i < 10; i++ {
		var closed atomic.Bool
		renewed, late := make(chan struct{}, 1), make(chan struct{}, 1)
		b := hooked{Backend: idemtest.NewMemoryBackend(), renew: func(context.Context) error {
			ch := renewed
			if closed.Load() {
				ch = late
			}
			select {
			case ch <- struct{}{}:
			default:
			}
			return nil
		}}
		// A renewal every 10 ms. Not shorter: a claim whose reply takes
		// longer than the trust (0.9 of the lease; -race on a loaded CI
		// machine took more than 3 ms) is refused before the work starts.
		const lease = 30 * time.Millisecond
		s := idem.New[order](idem.Options{Backend: b, Lease: lease, Codec: brokenCodec{}, Logger: slog.New(slog.DiscardHandler)})
		for _, key := range []string{"a", "b", "c"} {
			// Answered as if recorded; memory holds it, its lease renewed.
			_, err := s.RunOnce(context.Background(), key, "p", func(context.Context) (order, error) { return order{1, 1}, nil })
			require.NoError(t, err)
		}
		select { // renewals are running when Close begins
		case <-renewed:
		case <-time.After(5 * time.Second):
			t.Fatal("the held claims were not renewed")
		}
		closeWithin(t, s, 5*time.Second)
		closed.Store(true)
		select {
		case <-late:
			t.Fatal("a held claim was renewed after Close returned")
		case <-time.After(10 * lease):
		}
	}
}

// renewRefusedAfterComplete records the outcome, then holds Complete's
// reply until a renewal has been refused: the record is no longer
// pending, so the claim's next renewal gets ErrNotOwner.
type renewRefusedAfterComplete struct {
	backend.Backend
	refused chan struct{} // closed at the first refused renewal
	once    sync.Once
}

func (b *renewRefusedAfterComplete) Renew(ctx context.Context, key, token string, now time.Time, lease time.Duration) error {
	err := b.Backend.Renew(ctx, key, token, now, lease)
	if err != nil {
		b.once.Do(func() { close(b.refused) })
	}
	return err
}

func (b *renewRefusedAfterComplete) Complete(ctx context.Context, rec backend.Record, now time.Time, ttl time.Duration) error {
	if err := b.Backend.Complete(ctx, rec, now, ttl); err != nil {
		return err
	}
	<-b.refused
	return nil
}

// A work context ends as a finished ticket's does, not with ErrLeaseLost,
// when a renewal lands after the outcome was recorded: the lease was not
// lost, the work was over.
func TestRenewalAfterTheOutcomeIsRecordedIsNoLostLease(t *testing.T) {
	b := &renewRefusedAfterComplete{Backend: idemtest.NewMemoryBackend(), refused: make(chan struct{})}
	s := durableStore(t, b, idem.Options{Lease: 30 * time.Millisecond})
	tk, err := s.Begin(context.Background(), "k", "p")
	require.NoError(t, err)
	work := tk.Context()
	_, err = tk.Finish(order{1, 1}, nil)
	require.NoError(t, err)
	<-work.Done()
	assert.NotErrorIs(t, context.Cause(work), idem.ErrLeaseLost, "the work of a recorded outcome reads as a lost lease")
}

// A Backend whose Renew panics, on the timer's goroutine where nothing
// else could take the panic, made a renewal that failed; the process does
// not end. It is retried as any failed renewal, and the work ends with
// ErrLeaseLost once the trust runs out.
func TestRenewThatPanicsIsAFailedRenewal(t *testing.T) {
	var calls atomic.Int32
	b := hooked{Backend: idemtest.NewMemoryBackend(), renew: func(context.Context) error {
		calls.Add(1)
		panic("renew boom")
	}}
	s := durableStore(t, b, idem.Options{Lease: 30 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	var cause error
	_, err := s.RunOnce(context.Background(), "k", "p", func(ctx context.Context) (order, error) {
		<-ctx.Done()
		cause = context.Cause(ctx)
		return order{1, 1}, nil
	})
	require.NoError(t, err)
	assert.ErrorIs(t, cause, idem.ErrLeaseLost)
	assert.GreaterOrEqual(t, calls.Load(), int32(2), "a panicking renewal is retried")
}

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

// runtime.Goexit in the Backend's Complete, after the lease's stop
// function was taken off the ticket, still stops the lease's renewals:
// none runs past Close. Were they left running, the renewal timer's
// s.background.Add(1) would race Close's background.Wait, and the key would
// stay pending under a live lease that no process will ever record:
// stranded in flight for every other store.
func TestGoexitInBackendCompleteStopsRenewals(t *testing.T) {
	b := &exitingComplete{MemoryBackend: idemtest.NewMemoryBackend(), lateRenewal: make(chan struct{}, 1)}
	lease := 30 * time.Millisecond
	s := idem.New[string](idem.Options{Backend: b, Lease: lease, SettleTimeout: 50 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	runToEnd(t, func() {
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
