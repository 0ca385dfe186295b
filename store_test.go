package idem

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type receipt struct {
	Charge int
	Amount int
}

func TestLostReplyRunsOnce(t *testing.T) {
	s := newStore[receipt](t, Options{})
	var calls atomic.Int32
	charge := func(context.Context) (receipt, error) {
		return receipt{Charge: int(calls.Add(1)), Amount: 450}, nil
	}
	ctx := context.Background()

	first, err := s.RunOnce(ctx, "order-101", []byte("450"), charge)
	require.NoError(t, err)
	// The reply is lost; the client retries with the same key and payload.
	retry, err := s.RunOnce(ctx, "order-101", []byte("450"), charge)
	require.NoError(t, err)

	assert.Equal(t, int32(1), calls.Load(), "fn ran more than once")
	assert.Equal(t, first, retry)
}

func TestConcurrentDuplicatesCoalesce(t *testing.T) {
	for _, tc := range []struct {
		name     string
		detached bool // every caller's ctx can end, so fn runs on its own goroutine
	}{
		{"inline", false},
		{"detached", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const callers = 1000
			s := newStore[receipt](t, Options{})
			waits := callers - 1 // an inline owner does not wait; a detached one does
			ctx := context.Background()
			if tc.detached {
				waits++
				var cancel context.CancelFunc
				ctx, cancel = context.WithCancel(ctx)
				defer cancel()
			}
			parked := waitersParked(t, waits)
			var calls atomic.Int32
			charge := func(context.Context) (receipt, error) {
				n := calls.Add(1)
				<-parked // hold the execution until every duplicate is waiting on it
				return receipt{Charge: int(n), Amount: 450}, nil
			}

			start := make(chan struct{})
			results := make([]outcome[receipt], callers)
			var wg sync.WaitGroup
			for i := range callers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					v, err := s.RunOnce(ctx, "tap", "order-101", charge)
					results[i] = outcome[receipt]{v, err}
				}()
			}
			close(start)
			wg.Wait()

			assert.Equal(t, int32(1), calls.Load(), "fn must run exactly once")
			for i, r := range results {
				require.NoError(t, r.err, "caller %d", i)
				require.Equal(t, receipt{Charge: 1, Amount: 450}, r.val, "caller %d", i)
			}
		})
	}
}

func TestCancelledWaiterLeavesExecutionRunning(t *testing.T) {
	s := newStore[int](t, Options{})
	parked := waitersParked(t, 3) // the owner, the cancelled waiter and one that stays
	started, release := make(chan struct{}), make(chan struct{})
	fnCtxErr := make(chan error, 1)
	fn := func(ctx context.Context) (int, error) {
		close(started)
		<-release
		fnCtxErr <- ctx.Err()
		return 42, nil
	}

	// The owner's ctx can end too, so fn runs detached and could be hit by
	// a cancellation that leaked through.
	ownerCtx, cancelOwner := context.WithCancel(context.Background())
	defer cancelOwner()
	owner := runAsync(ownerCtx, s, "k", "p", fn)
	<-started
	leaver, cancel := context.WithCancel(context.Background())
	left := runAsync(leaver, s, "k", "p", fn)
	stayer := runAsync(context.Background(), s, "k", "p", fn)
	<-parked
	cancel()

	got := <-left // returns while fn is still blocked
	assert.ErrorIs(t, got.err, ErrInProgress)
	assert.ErrorIs(t, got.err, context.Canceled)

	close(release)
	assert.NoError(t, <-fnCtxErr, "fn's context was cancelled by a waiter")
	for _, ch := range []<-chan outcome[int]{owner, stayer} {
		o := <-ch
		assert.NoError(t, o.err)
		assert.Equal(t, 42, o.val)
	}
}

func TestCancelledFirstCallerLeavesExecutionRunning(t *testing.T) {
	type ctxKey struct{}
	s := newStore[int](t, Options{})
	parked := waitersParked(t, 2) // the first caller itself, and a duplicate
	started, release := make(chan struct{}), make(chan struct{})
	var calls atomic.Int32
	fnSaw := make(chan [2]any, 1)
	fn := func(ctx context.Context) (int, error) {
		calls.Add(1)
		close(started)
		<-release
		fnSaw <- [2]any{ctx.Err(), ctx.Value(ctxKey{})}
		return 7, nil
	}

	first, cancel := context.WithCancel(context.WithValue(context.Background(), ctxKey{}, "trace-1"))
	firstDone := runAsync(first, s, "k", "p", fn)
	<-started
	dup := runAsync(context.Background(), s, "k", "p", fn)
	<-parked
	cancel()

	got := <-firstDone
	assert.ErrorIs(t, got.err, ErrInProgress)
	assert.ErrorIs(t, got.err, context.Canceled)

	close(release)
	saw := <-fnSaw
	assert.Nil(t, saw[0], "fn's context was cancelled with the first caller")
	assert.Equal(t, "trace-1", saw[1], "fn's context lost the first caller's values")
	o := <-dup
	require.NoError(t, o.err)
	assert.Equal(t, 7, o.val)

	v, err := s.RunOnce(context.Background(), "k", "p", fn)
	require.NoError(t, err)
	assert.Equal(t, 7, v)
	assert.Equal(t, int32(1), calls.Load())
}

func TestErrorReleasesKey(t *testing.T) {
	const waiters = 20
	s := newStore[int](t, Options{})
	parked := waitersParked(t, waiters)
	boom := errors.New("gateway timeout")
	var calls atomic.Int32
	started := make(chan struct{})
	failing := func(context.Context) (int, error) {
		calls.Add(1)
		close(started)
		<-parked
		return 0, boom
	}

	owner := runAsync(context.Background(), s, "k", "p", failing)
	<-started
	var chans []<-chan outcome[int]
	for range waiters {
		chans = append(chans, runAsync(context.Background(), s, "k", "p", failing))
	}
	for _, ch := range append(chans, owner) {
		assert.ErrorIs(t, (<-ch).err, boom)
	}
	assert.Equal(t, int32(1), calls.Load())
	assert.Equal(t, 0, s.Len(), "a failed key must be released")

	v, err := s.RunOnce(context.Background(), "k", "p", func(context.Context) (int, error) { return 5, nil })
	require.NoError(t, err, "the next call must run fn again")
	assert.Equal(t, 5, v)
}

func TestFinalErrorIsReplayed(t *testing.T) {
	s := newStore[int](t, Options{})
	declined := errors.New("card declined")
	var calls atomic.Int32
	fn := func(context.Context) (int, error) {
		calls.Add(1)
		return 0, Final(declined)
	}
	for range 3 {
		_, err := s.RunOnce(context.Background(), "k", "p", fn)
		assert.ErrorIs(t, err, declined)
		assert.True(t, IsFinal(err))
		assert.Equal(t, "card declined", err.Error())
	}
	assert.Equal(t, int32(1), calls.Load(), "a final error must be replayed, not re-executed")
}

func TestPanicReachesEveryWaiter(t *testing.T) {
	for _, tc := range []struct {
		name     string
		detached bool // the first caller's ctx can end, so fn runs on its own goroutine
	}{
		{"inline", false},
		{"detached", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const callers = 10
			s := newStore[int](t, Options{})
			waits := callers - 1 // an inline owner does not wait; a detached one does
			if tc.detached {
				waits++
			}
			parked := waitersParked(t, waits)
			started := make(chan struct{})
			panicky := func(context.Context) (int, error) {
				close(started)
				<-parked
				panic("kaboom")
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if !tc.detached {
				ctx = context.Background()
			}
			chans := []<-chan outcome[int]{runAsync(ctx, s, "k", "p", panicky)}
			<-started
			for range callers - 1 {
				chans = append(chans, runAsync(context.Background(), s, "k", "p", panicky))
			}
			for _, ch := range chans {
				var pe *PanicError
				err := (<-ch).err
				require.ErrorAs(t, err, &pe)
				assert.Equal(t, "kaboom", pe.Value)
				assert.Contains(t, string(pe.Stack), "TestPanicReachesEveryWaiter")
			}
			assert.Equal(t, 0, s.Len(), "a panicked key must be released")
			v, err := s.RunOnce(context.Background(), "k", "p", func(context.Context) (int, error) { return 1, nil })
			require.NoError(t, err)
			assert.Equal(t, 1, v)
		})
	}
}

func TestPanicWithFinalErrorIsNotRemembered(t *testing.T) {
	s := newStore[int](t, Options{})
	_, err := s.RunOnce(context.Background(), "k", "p", func(context.Context) (int, error) {
		panic(Final(errors.New("declined")))
	})
	var pe *PanicError
	require.ErrorAs(t, err, &pe)
	assert.Equal(t, 0, s.Len(), "a panic releases the key, whatever its value")
	assert.NotContains(t, err.Error(), "goroutine", "the stack belongs in the Stack field, not the message")
}

func TestGoexitInFnReleasesKey(t *testing.T) {
	s := newStore[int](t, Options{})
	parked := waitersParked(t, 1)
	started := make(chan struct{})
	quitter := func(context.Context) (int, error) {
		close(started)
		<-parked
		runtime.Goexit()
		return 0, nil
	}
	go func() { _, _ = s.RunOnce(context.Background(), "k", "p", quitter) }()
	<-started
	_, err := s.RunOnce(context.Background(), "k", "p", quitter)
	assert.ErrorIs(t, err, ErrGoexit)
	assert.Equal(t, 0, s.Len())
}

func TestPayloadMismatch(t *testing.T) {
	s := newStore[int](t, Options{})
	started, release := make(chan struct{}), make(chan struct{})
	fn := func(context.Context) (int, error) {
		close(started)
		<-release
		return 101, nil
	}
	first := runAsync(context.Background(), s, "k", "order-101", fn)
	<-started

	_, err := s.RunOnce(context.Background(), "k", "order-102", fn)
	assert.ErrorIs(t, err, ErrPayloadMismatch, "while the first call is in flight")

	close(release)
	o := <-first
	require.NoError(t, o.err, "the in-flight execution was disturbed")
	assert.Equal(t, 101, o.val)

	_, err = s.RunOnce(context.Background(), "k", "order-102", fn)
	assert.ErrorIs(t, err, ErrPayloadMismatch, "after the first call completed")
	v, err := s.RunOnce(context.Background(), "k", "order-101", fn)
	require.NoError(t, err)
	assert.Equal(t, 101, v, "the original payload still replays")
}
