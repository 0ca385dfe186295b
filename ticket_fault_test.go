package idem

// The two-phase API (Begin / Ticket) under misuse and faults: a ticket
// finished twice or on another goroutine, a Final panic under a deferred
// Release, a Context asked for after Finish, an ExecutionTimeout that ends
// the work of a durable ticket.

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Context is documented to end when the ticket is finished. Asked for only
// after Finish (no Backend), it is done too, not a live context with a
// timer that nothing stops.
func TestTicketContextAfterFinishIsDone(t *testing.T) {
	s := newStore[int](t, Options{ExecutionTimeout: time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tk, err := s.Begin(ctx, "k", "p")
	require.NoError(t, err)
	tk.Finish(1, nil)
	assert.Error(t, tk.Context().Err(), "Context after Finish should be done")
}

func TestTicketFinishTwiceReleaseAfterFinishOtherGoroutine(t *testing.T) {
	s := newStore[int](t, Options{Backend: newStubBackend()})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tk, err := s.Begin(ctx, "k", "p")
	require.NoError(t, err)
	w := beginAsyncT(context.Background(), s, "k")
	done := make(chan struct{})
	go func() { // Finish on another goroutine than Begin's
		defer close(done)
		v, err := tk.Finish(3, nil)
		assert.NoError(t, err)
		assert.Equal(t, 3, v)
	}()
	<-done
	v, err := tk.Finish(4, errors.New("late"))
	assert.NoError(t, err)
	assert.Equal(t, 3, v, "a second Finish changes nothing")
	tk.Release() // no-op
	o := <-w
	require.NoError(t, o.err)
	ok := o.t.Replayed()
	v, err = o.t.Result()
	assert.True(t, ok)
	assert.NoError(t, err)
	assert.Equal(t, 3, v)
	tk2, err := s.Begin(context.Background(), "k", "p")
	require.NoError(t, err)
	ok = tk2.Replayed()
	v, _ = tk2.Result()
	assert.True(t, ok)
	assert.Equal(t, 3, v)
}

func TestTicketPanicFinalWithDeferredRelease(t *testing.T) {
	s := newStore[int](t, Options{Backend: newStubBackend()})
	tk, err := s.Begin(context.Background(), "k", "p")
	require.NoError(t, err)
	parked := waitersParked(t, 1)
	w := beginAsyncT(context.Background(), s, "k")
	<-parked
	var got any
	func() {
		defer func() { got = recover() }()
		defer tk.Release()
		panic(Final(errors.New("declined")))
	}()
	assert.True(t, IsFinal(got.(error)), "the panic goes on up with its value")
	o := <-w
	require.ErrorIs(t, o.err, errReleased, "the waiter is told the key was released")
	assert.False(t, IsFinal(o.err))
	tk2, err := s.Begin(context.Background(), "k", "p")
	require.NoError(t, err)
	ok := tk2.Replayed()
	assert.False(t, ok, "a panic, even of a Final error, is not remembered")
	tk2.Release()
}

func TestTicketDurableExecutionTimeout(t *testing.T) {
	s := newStore[int](t, Options{Backend: newStubBackend(), ExecutionTimeout: 20 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	tk, err := s.Begin(ctx, "k", "p")
	require.NoError(t, err)
	cancel()
	// Not NoError: on a slow machine the 20 ms timeout may already have run out.
	assert.NotErrorIs(t, tk.Context().Err(), context.Canceled, "Begin's cancellation does not end the work")
	<-tk.Context().Done()
	assert.ErrorIs(t, tk.Context().Err(), context.DeadlineExceeded)
	_, err = tk.Finish(0, tk.Context().Err())
	assert.Error(t, err)
	tk2, err := s.Begin(context.Background(), "k", "p")
	require.NoError(t, err)
	tk2.Release()
}
