package idem

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A caller that forgets to ask Replayed cannot do the work a second time
// without noticing: the replayed ticket's Context has ended, with
// ErrReplayed as its cause, before any work starts, and its Finish records
// nothing and says so. In memory and with a Backend alike.
func TestReplayedTicketRefusesWork(t *testing.T) {
	for name, opts := range map[string]Options{
		"memory":  {},
		"durable": {Backend: newStubBackend()},
	} {
		t.Run(name, func(t *testing.T) {
			s := newStore[int](t, opts)
			first := begin(t, s, "k")
			_, err := first.Finish(7, nil)
			require.NoError(t, err)

			tk := replay(t, s, "k")
			ctx := tk.Context()
			require.Error(t, ctx.Err(), "the work's context has ended before any work")
			assert.ErrorIs(t, context.Cause(ctx), ErrReplayed)
			v, err := tk.Finish(99, nil)
			assert.ErrorIs(t, err, ErrReplayed, "Finish on a replay fails loudly")
			assert.Zero(t, v)
			tk.Release() // nothing to release

			again := replay(t, s, "k")
			v, err = again.Result()
			require.NoError(t, err)
			assert.Equal(t, 7, v, "the replay's Finish recorded nothing")
			v, err = again.Do(func(context.Context) (int, error) {
				t.Error("Do ran fn on a replayed ticket")
				return 0, nil
			})
			assert.NoError(t, err)
			assert.Equal(t, 7, v)
		})
	}
}

func replay(t *testing.T, s *Store[int], key string) *Ticket[int] {
	t.Helper()
	tk, err := s.Begin(context.Background(), key, "p")
	require.NoError(t, err)
	require.True(t, tk.Replayed())
	return tk
}

// Result is the ticket's outcome: an owner's only once Finish ran.
func TestTicketResult(t *testing.T) {
	s := newStore[int](t, Options{})
	tk := begin(t, s, "k")
	require.False(t, tk.Replayed())
	_, err := tk.Result()
	assert.ErrorIs(t, err, errNotFinished)
	_, _ = tk.Finish(3, nil)
	v, err := tk.Result()
	assert.NoError(t, err)
	assert.Equal(t, 3, v)
}

// The cases of ErrInProgress each match ErrInProgress, and each also
// matches what tells it apart.
func TestInProgressCasesTellApart(t *testing.T) {
	t.Run("ctx ended while waiting", func(t *testing.T) {
		s := newStore[int](t, Options{})
		owner := begin(t, s, "k")
		defer owner.Release()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
		defer cancel()
		_, err := s.Begin(ctx, "k", "p")
		assert.ErrorIs(t, err, ErrInProgress)
		assert.ErrorIs(t, err, context.DeadlineExceeded)
		assert.NotErrorIs(t, err, ErrKeyHeld)
		assert.NotErrorIs(t, err, ErrClosed)
	})
	t.Run("Forget and Resolve of a held key", func(t *testing.T) {
		s := newStore[int](t, Options{Backend: newStubBackend()})
		owner := begin(t, s, "k")
		defer owner.Release()
		err := s.Forget(context.Background(), "k")
		assert.ErrorIs(t, err, ErrInProgress)
		assert.ErrorIs(t, err, ErrKeyHeld)
		err = s.Resolve(context.Background(), "k", 1, nil)
		assert.ErrorIs(t, err, ErrInProgress)
		assert.ErrorIs(t, err, ErrKeyHeld)
	})
	t.Run("the store closes while waiting on another process", func(t *testing.T) {
		held := heldElsewhere{finished: make(chan struct{})}
		defer close(held.finished)
		s := New[int](Options{Backend: held, SweepInterval: -1})
		done := make(chan error, 1)
		go func() {
			_, err := s.Begin(context.Background(), "k", "p")
			done <- err
		}()
		for !s.table.inFlight("k") {
			runtime.Gosched()
		}
		_ = s.Close()
		err := <-done
		assert.ErrorIs(t, err, ErrInProgress)
		assert.ErrorIs(t, err, ErrClosed)
		assert.NotErrorIs(t, err, context.Canceled)
	})
	assert.ErrorIs(t, ErrHeldOutsideTx, ErrInProgress)
	assert.False(t, errors.Is(ErrHeldOutsideTx, ErrKeyHeld))
}
