package idem_test

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"path/filepath"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/bolt"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// blocking is a Backend whose Sweep and Claim block until their context
// ends, announcing each call on entered: a database that never answers.
type blocking struct {
	backend.Backend
	entered chan string
}

func (b blocking) Sweep(ctx context.Context, now time.Time, limit int) (int, error) {
	b.entered <- "Sweep"
	<-ctx.Done()
	return 0, ctx.Err()
}

func (b blocking) Claim(ctx context.Context, rec backend.Record, now time.Time, lease time.Duration) (backend.Record, bool, error) {
	b.entered <- "Claim"
	<-ctx.Done()
	return backend.Record{}, false, ctx.Err()
}

// closeWithin fails the test if Close does not return within d.
func closeWithin[R any](t *testing.T, s *idem.Store[R], d time.Duration) {
	t.Helper()
	closed := make(chan struct{})
	go func() { _ = s.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(d):
		t.Fatalf("Close did not return within %v", d)
	}
}

// The background sweeper's call into a backend that never answers ends
// when Close begins.
func TestCloseEndsABlockedSweep(t *testing.T) {
	b := blocking{Backend: idemtest.NewMemoryBackend(), entered: make(chan string, 1)}
	s := idem.New[order](idem.Options{Backend: b, SweepInterval: time.Millisecond})
	require.Equal(t, "Sweep", <-b.entered)
	closeWithin(t, s, 10*time.Second)
}

// A claim against a backend that never answers ends when Close begins; its
// caller hears a BackendError.
func TestCloseEndsAHungClaim(t *testing.T) {
	b := blocking{Backend: idemtest.NewMemoryBackend(), entered: make(chan string, 1)}
	s := idem.New[order](idem.Options{Backend: b, SweepInterval: -1, SettleTimeout: 50 * time.Millisecond})
	result := make(chan error, 1)
	go func() {
		_, err := s.RunOnce(context.Background(), "k", "p", func(context.Context) (order, error) { return order{}, nil })
		result <- err
	}()
	require.Equal(t, "Claim", <-b.entered)
	closeWithin(t, s, 10*time.Second)
	var be *idem.BackendError
	assert.ErrorAs(t, <-result, &be)
}

// Forget after Close touches nothing.
func TestForgetAfterCloseKeepsTheRecord(t *testing.T) {
	mem := idemtest.NewMemoryBackend()
	s := idem.New[order](idem.Options{Backend: mem})
	_, err := s.RunOnce(context.Background(), "k", "p", func(context.Context) (order, error) { return order{1, 1}, nil })
	require.NoError(t, err)
	require.NoError(t, s.Close())
	assert.ErrorIs(t, s.Forget(context.Background(), "k"), idem.ErrClosed)
	_, ok, err := mem.Get(context.Background(), "k", time.Now())
	require.NoError(t, err)
	assert.True(t, ok, "a closed store's Forget deleted the record")
}

// A key in flight in this store is not forgotten, even once its lease has
// lapsed by the backend's clock: fn runs once.
func TestForgetRefusesAKeyInFlightHere(t *testing.T) {
	mem := idemtest.NewMemoryBackend()
	clock := idemtest.NewClock(time.Now().UTC().Truncate(time.Second))
	s := durableStore(t, mem, idem.Options{Now: clock.Now, Lease: time.Hour})
	inFn, release := make(chan struct{}), make(chan struct{})
	calls, fn := countingFn(order{2, 2})
	done := make(chan error, 1)
	go func() {
		_, err := s.RunOnce(context.Background(), "k", "p", func(ctx context.Context) (order, error) {
			close(inFn)
			<-release
			return fn(ctx)
		})
		done <- err
	}()
	<-inFn
	clock.Advance(2 * time.Hour) // the memory backend now sees the lease lapsed
	assert.ErrorIs(t, s.Forget(context.Background(), "k"), idem.ErrInProgress)
	close(release)
	require.NoError(t, <-done)
	v, err := s.RunOnce(context.Background(), "k", "p", fn)
	require.NoError(t, err)
	assert.Equal(t, order{2, 2}, v)
	assert.Equal(t, int32(1), calls.Load(), "Forget of a key in flight let fn run twice")
}

// Forget and Sweep failures are BackendErrors that keep their cause.
func TestForgetAndSweepFailuresAreBackendErrors(t *testing.T) {
	b := idemtest.Faulty{Backend: idemtest.NewMemoryBackend(), Fail: func(string) error { return errLost }}
	s := durableStore(t, b, idem.Options{SweepInterval: -1, SettleTimeout: 50 * time.Millisecond})
	var be *idem.BackendError
	err := s.Forget(context.Background(), "k")
	require.ErrorAs(t, err, &be)
	assert.Equal(t, "forget", be.Op)
	assert.ErrorIs(t, err, errLost)
	_, err = s.Sweep(context.Background())
	require.ErrorAs(t, err, &be)
	assert.Equal(t, "sweep", be.Op)
	assert.ErrorIs(t, err, errLost)
}

// With a Backend, MaxKeys counts the keys held in memory: a full store still
// replays the outcomes the backend remembers, and refuses only new keys.
func TestFullStoreReplaysFromTheBackend(t *testing.T) {
	mem := idemtest.NewMemoryBackend()
	s := durableStore(t, mem, idem.Options{MaxKeys: 1})
	calls, fn := countingFn(order{3, 3})
	_, err := s.RunOnce(context.Background(), "done", "p", fn)
	require.NoError(t, err)

	inFn, release := make(chan struct{}), make(chan struct{})
	busy := make(chan error, 1)
	go func() { // holds the only room in memory
		_, err := s.RunOnce(context.Background(), "busy", "p", func(context.Context) (order, error) {
			close(inFn)
			<-release
			return order{}, nil
		})
		busy <- err
	}()
	<-inFn
	v, err := s.RunOnce(context.Background(), "done", "p", fn)
	require.NoError(t, err, "a full store refused to replay a remembered outcome")
	assert.Equal(t, order{3, 3}, v)
	_, err = s.RunOnce(context.Background(), "done", "another payload", fn)
	assert.ErrorIs(t, err, idem.ErrPayloadMismatch)
	_, err = s.RunOnce(context.Background(), "new", "p", fn)
	assert.ErrorIs(t, err, idem.ErrFull, "a new key needs room")
	close(release)
	require.NoError(t, <-busy)
	assert.Equal(t, int32(1), calls.Load())
}

// A TTL past the year 2262 (math.MaxInt64, "for ever") does not overflow
// bolt's time encoding: the outcome is kept, and fn runs once.
func TestForeverTTLOnBolt(t *testing.T) {
	b, err := bolt.Open(filepath.Join(t.TempDir(), "idem.db"), nil)
	require.NoError(t, err)
	defer b.Close()
	s := durableStore(t, b, idem.Options{TTL: math.MaxInt64})
	calls, fn := countingFn(order{4, 4})
	for range 2 {
		v, err := s.RunOnce(context.Background(), "k", "p", fn)
		require.NoError(t, err)
		assert.Equal(t, order{4, 4}, v)
	}
	assert.Equal(t, int32(1), calls.Load(), "an outcome kept for ever expired at once")
}

// Shutdown is Close bounded by a context: it refuses new calls at once,
// and when its context ends first it says what it left, which goes on and
// is settled as it finishes; a later Close waits for it.
func TestShutdownSaysWhatItLeft(t *testing.T) {
	s := idem.New[int](idem.Options{SweepInterval: -1})
	tk, err := s.Begin(context.Background(), "k", "p")
	require.NoError(t, err)
	require.False(t, tk.Replayed())

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	err = s.Shutdown(ctx)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Contains(t, err.Error(), "keys in flight: 1")
	_, err = s.RunOnce(context.Background(), "other", "p", func(context.Context) (int, error) { return 1, nil })
	assert.ErrorIs(t, err, idem.ErrClosed, "refused from the first Shutdown on")

	v, err := tk.Finish(5, nil)
	require.NoError(t, err, "the open ticket goes on")
	assert.Equal(t, 5, v)
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	select {
	case err := <-closed:
		assert.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not return once the ticket finished")
	}
	assert.NoError(t, s.Shutdown(context.Background()), "closed: nothing left")
	var nilCtx context.Context
	assert.Error(t, s.Shutdown(nilCtx), "a nil context")
}

// An idle store shuts down cleanly even for a ctx that has already ended,
// as http.Server.Shutdown does.
func TestShutdownIdleWithEndedContext(t *testing.T) {
	s := idem.New[int](idem.Options{SweepInterval: -1})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	assert.NoError(t, s.Shutdown(ctx))
}

// A failure before commit whose Release never gets through leaves a claim
// the store retries in the background. Close gives it one settle timeout,
// then leaves it to its lease: the key then reads as interrupted though
// its work failed, until an operator Forgets it. Shutdown must say so.
func TestShutdownSaysItGaveUpARelease(t *testing.T) {
	mem := idemtest.NewMemoryBackend()
	b := idemtest.Faulty{Backend: mem, Fail: func(op string) error {
		if op == "Release" {
			return errLost
		}
		return nil
	}}
	s := idem.New[order](idem.Options{Backend: b, SettleTimeout: 50 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	boom := errors.New("before commit")
	_, err := s.RunOnce(context.Background(), "failed", "p", func(context.Context) (order, error) { return order{}, boom })
	require.ErrorIs(t, err, boom)
	err = s.Shutdown(context.Background())
	require.Error(t, err, "the release was given up: the key is left claimed")
	assert.Contains(t, err.Error(), "1 claims of failed or unstarted work were not released")
	closeWithin(t, s, 5*time.Second)

	// What the operator would find: the claim is still there.
	_, found, gerr := mem.Get(context.Background(), "failed", time.Now())
	require.NoError(t, gerr)
	assert.True(t, found, "the claim was left to its lease")
}

// An outcome the Codec cannot encode is held in memory and its claim kept
// until Close; nothing ever records it. Shutdown with time to spare must
// say so, as it does when its ctx ends first.
func TestShutdownSaysAnOutcomeCouldNotBeEncoded(t *testing.T) {
	mem := idemtest.NewMemoryBackend()
	s := idem.New[order](idem.Options{Backend: mem, Codec: refusingCodec{}, Logger: slog.New(slog.DiscardHandler)})
	got, err := s.RunOnce(context.Background(), "k", "p", func(context.Context) (order, error) { return order{ID: 1}, nil })
	require.NoError(t, err, "the outcome is answered all the same")
	require.Equal(t, order{ID: 1}, got)
	err = s.Shutdown(context.Background())
	require.Error(t, err, "an outcome was never recorded")
	assert.Contains(t, err.Error(), "1 outcomes held in memory could not be written")
}

// refusingCodec cannot encode anything.
type refusingCodec struct{}

func (refusingCodec) Marshal(any) ([]byte, error) { return nil, errors.New("cannot encode") }
func (refusingCodec) Unmarshal([]byte, any) error { return nil }
