package idem_test

import (
	"context"
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/seed094d4201/idem/internal/txrun"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A backend that accepts a claim and never answers, nor answers the
// read-back of it: the caller's ctx bounds its wait, and the claim of
// unknown fate is settled in the background (issue 18: the read-back ran
// under SettleTimeout, past the caller's deadline).
func TestCallerCtxBoundsAClaimThatNeverAnswers(t *testing.T) {
	mem := idemtest.NewMemoryBackend()
	hang := func(ctx context.Context) error {
		<-ctx.Done()
		return ctx.Err()
	}
	b := hooked{Backend: mem,
		claim: func(ctx context.Context, _ backend.Record, _ time.Time, _ time.Duration) (backend.Record, bool, error) {
			return backend.Record{}, false, hang(ctx)
		},
		get: hang,
	}
	s := durableStore(t, b, idem.Options{SettleTimeout: 2 * time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	calls, fn := countingFn(order{})
	_, err := s.RunOnce(ctx, "k", "p", fn)
	took := time.Since(start)
	require.Error(t, err)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Less(t, took, time.Second, "the caller waited past its ctx")
	assert.Zero(t, calls.Load())
}

// A backend that cannot be reached answers a *BackendError, even when the
// caller's ctx has ended by the time it says so (as a client library that
// retries its dials until the deadline does); never ErrInProgress, which
// would say another attempt is running (issue 18).
func TestUnreachableBackendIsABackendError(t *testing.T) {
	refused := &syscallErr{syscall.ECONNREFUSED}
	b := hooked{Backend: idemtest.NewMemoryBackend(),
		claim: func(ctx context.Context, _ backend.Record, _ time.Time, _ time.Duration) (backend.Record, bool, error) {
			<-ctx.Done() // dials, refused, until the deadline
			return backend.Record{}, false, refused
		},
		get: func(context.Context) error { return refused },
	}
	s := durableStore(t, b, idem.Options{SettleTimeout: 100 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := s.RunOnce(ctx, "k", "p", func(context.Context) (order, error) { return order{}, nil })
	var be *idem.BackendError
	require.ErrorAs(t, err, &be)
	assert.ErrorIs(t, err, syscall.ECONNREFUSED)
	assert.NotErrorIs(t, err, idem.ErrInProgress)
}

type syscallErr struct{ errno syscall.Errno }

func (e *syscallErr) Error() string { return "dial tcp 127.0.0.1:1: connect: " + e.errno.Error() }
func (e *syscallErr) Unwrap() error { return e.errno }

// A Backend whose Claim answer breaks its contract (a bug in a user's
// backend) gets a *BackendError; fn does not run, and nothing is answered
// as a success (issue 18: Record{}, true, nil replayed the zero value).
func TestMalformedClaimAnswerIsABackendError(t *testing.T) {
	answers := map[string]func(rec backend.Record) (backend.Record, bool){
		"claimed, empty record": func(backend.Record) (backend.Record, bool) { return backend.Record{}, true },
		"claimed, other token": func(rec backend.Record) (backend.Record, bool) {
			rec.Token = "someone-else"
			return rec, true
		},
		"claimed, completed": func(rec backend.Record) (backend.Record, bool) {
			rec.State = backend.StateCompleted
			return rec, true
		},
		"not claimed, no token": func(rec backend.Record) (backend.Record, bool) {
			rec.Token, rec.State = "", backend.StateCompleted
			return rec, false
		},
		"not claimed, no state": func(rec backend.Record) (backend.Record, bool) {
			rec.Token, rec.State = "other", 0
			return rec, false
		},
		"not claimed, other key": func(rec backend.Record) (backend.Record, bool) {
			rec.Key, rec.Token, rec.State = "other-key", "other", backend.StateCompleted
			return rec, false
		},
	}
	for name, answer := range answers {
		t.Run(name, func(t *testing.T) {
			b := hooked{Backend: idemtest.NewMemoryBackend(),
				claim: func(_ context.Context, rec backend.Record, _ time.Time, _ time.Duration) (backend.Record, bool, error) {
					got, claimed := answer(rec)
					return got, claimed, nil
				}}
			s := durableStore(t, b, idem.Options{SettleTimeout: 50 * time.Millisecond})
			calls, fn := countingFn(order{1, 1})
			_, err := s.RunOnce(context.Background(), "k", "p", fn)
			var be *idem.BackendError
			require.ErrorAs(t, err, &be)
			assert.Zero(t, calls.Load(), "fn ran under a claim the backend did not make")
		})
	}
}

// With MaxKeys reached, BeginLocal (what a RunOnceTx claims through)
// answers a key whose outcome the Backend holds with that outcome, as
// Begin does, not ErrFull (issue 18).
func TestBeginLocalReplaysWhenMemoryIsFull(t *testing.T) {
	mem := idemtest.NewMemoryBackend()
	writer := durableStore(t, mem, idem.Options{})
	_, err := writer.RunOnce(context.Background(), "done", "p", func(context.Context) (order, error) { return order{3, 3}, nil })
	require.NoError(t, err)

	s := durableStore(t, mem, idem.Options{MaxKeys: 1})
	busy, err := txrun.Of(s).BeginLocal(context.Background(), "busy", "p") // fills memory
	require.NoError(t, err)
	defer busy.Release()
	_, err = txrun.Of(s).BeginLocal(context.Background(), "new", "p")
	require.ErrorIs(t, err, idem.ErrFull)

	tk, err := txrun.Of(s).BeginLocal(context.Background(), "done", "p")
	require.NoError(t, err)
	ok := tk.Replayed()
	v, ferr := tk.Result()
	require.True(t, ok)
	require.NoError(t, ferr)
	assert.Equal(t, order{3, 3}, v)
}

// A Ticket's Context ends when the ticket is finished or released, even
// with no Backend and no ExecutionTimeout: the work's goroutines stop
// (issue 18).
func TestTicketContextEndsWithTheTicket(t *testing.T) {
	s := newStore[int](t, idem.Options{})
	for _, end := range []string{"Finish", "Release"} {
		tk, err := s.Begin(context.Background(), "k-"+end, "p")
		require.NoError(t, err)
		ctx := tk.Context()
		require.NoError(t, ctx.Err())
		if end == "Finish" {
			_, _ = tk.Finish(1, nil)
		} else {
			tk.Release()
		}
		select {
		case <-ctx.Done():
		case <-time.After(5 * time.Second):
			t.Fatalf("the Context did not end with %s", end)
		}
		assert.True(t, errors.Is(ctx.Err(), context.Canceled))
	}
}
