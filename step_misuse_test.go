package idem_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A goroutine that fn left running calls Step after the operation failed,
// the key was released and a retry ran: the step must not run a second
// time (issue 18: the charge ran, and only then did Step fail to record).
func TestStepAfterTheOperationEndedDoesNotRun(t *testing.T) {
	for _, tc := range stepBackends {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore[string](t, idem.Options{Backend: tc.b(t), Resume: true})
			var charges atomic.Int32
			charge := func(context.Context) (int, error) { return int(charges.Add(1)), nil }
			late, lateErr := make(chan context.Context, 1), make(chan error, 1)
			_, err := s.RunOnce(context.Background(), "k", "p", func(ctx context.Context) (string, error) {
				late <- ctx // kept by a goroutine that outlives fn
				return "", errors.New("transient, before any step")
			})
			require.Error(t, err)
			_, err = s.RunOnce(context.Background(), "k", "p", func(ctx context.Context) (string, error) {
				_, err := idem.Step(ctx, "charge", charge)
				return "ok", err
			})
			require.NoError(t, err)
			go func() {
				_, err := idem.Step(<-late, "charge", charge)
				lateErr <- err
			}()
			require.Error(t, <-lateErr)
			assert.Equal(t, int32(1), charges.Load(), "the charge ran twice")
		})
	}
}

// A step that calls its own name, directly or through another step, gets
// an error at once instead of waiting on itself for ever with the key held
// (issue 18).
func TestStepCallingItselfFails(t *testing.T) {
	s := newStore[string](t, idem.Options{})
	run := func(key string, fn func(context.Context) (string, error)) error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := s.RunOnce(ctx, key, "p", fn) // the caller leaves at its deadline even if fn is stuck
		return err
	}
	err := run("direct", func(ctx context.Context) (string, error) {
		return idem.Step(ctx, "a", func(ctx context.Context) (string, error) {
			return idem.Step(ctx, "a", func(context.Context) (string, error) { return "inner", nil })
		})
	})
	require.ErrorContains(t, err, "inside itself")
	err = run("indirect", func(ctx context.Context) (string, error) {
		return idem.Step(ctx, "a", func(ctx context.Context) (string, error) {
			return idem.Step(ctx, "b", func(ctx context.Context) (string, error) {
				return idem.Step(ctx, "a", func(context.Context) (string, error) { return "inner", nil })
			})
		})
	})
	require.ErrorContains(t, err, "inside itself")
}

// A second call of a running step waits for the first only as long as the
// operation's context lives.
func TestStepWaitEndsWithTheContext(t *testing.T) {
	s := newStore[string](t, idem.Options{})
	release := make(chan struct{})
	defer close(release)
	started := make(chan struct{})
	_, err := s.RunOnce(context.Background(), "k", "p", func(ctx context.Context) (string, error) {
		go func() {
			_, _ = idem.Step(ctx, "slow", func(context.Context) (string, error) {
				close(started)
				<-release
				return "", nil
			})
		}()
		<-started
		wctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		return idem.Step(wctx, "slow", func(context.Context) (string, error) { return "second", nil })
	})
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

// Step, StepKey and OperationKey answer a nil ctx instead of panicking.
func TestStepNilContext(t *testing.T) {
	var nilCtx context.Context
	assert.NotPanics(t, func() {
		_, err := idem.Step(nilCtx, "a", func(context.Context) (int, error) { return 1, nil })
		assert.Error(t, err)
		assert.Equal(t, "", idem.StepKey(nilCtx))
		assert.Equal(t, "", idem.OperationKey(nilCtx))
	})
}

// StepKey inside an operation nested in another's step, outside any step
// of its own, is the nested operation's OperationKey, not a key of the
// outer step's name (issue 18).
func TestStepKeyOfANestedOperation(t *testing.T) {
	outer := newStore[string](t, idem.Options{})
	inner := newStore[string](t, idem.Options{})
	var stepKey, opKey string
	_, err := outer.RunOnce(context.Background(), "outer", "p", func(ctx context.Context) (string, error) {
		return idem.Step(ctx, "pay", func(ctx context.Context) (string, error) {
			return inner.RunOnce(ctx, "inner", "p", func(ctx context.Context) (string, error) {
				stepKey, opKey = idem.StepKey(ctx), idem.OperationKey(ctx)
				return "", nil
			})
		})
	})
	require.NoError(t, err)
	assert.Equal(t, opKey, stepKey)
}

// A recovery point resumes whatever the store's clock does: a step
// recorded, fn failing after it, then the clock stepped back by hours (an
// NTP step) must not make the lapsed claim look live again (issue 18).
func TestRecoveryPointSurvivesABackwardClockStep(t *testing.T) {
	for _, tc := range stepBackends {
		t.Run(tc.name, func(t *testing.T) {
			clock := idemtest.NewClock(time.Unix(1_800_000_000, 0))
			s := newStore[string](t, idem.Options{Backend: tc.b(t), Resume: true, Now: clock.Now})
			atRecoveryPoint(t, s, "k", "p")
			clock.Advance(-(3*time.Hour + 20*time.Minute))
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			var reran atomic.Bool
			got, err := s.RunOnce(ctx, "k", "p", func(ctx context.Context) (string, error) {
				v, err := idem.Step(ctx, "a", func(context.Context) (int, error) { reran.Store(true); return 2, nil })
				if v != 1 {
					return "", errors.New("the recorded step did not replay")
				}
				return "resumed", err
			})
			require.NoError(t, err)
			assert.Equal(t, "resumed", got)
			assert.False(t, reran.Load())
		})
	}
}

// StepKey must differ from OperationKey for every step: a step named ""
// gets the operation's own key, so a service handed both (the whole
// operation's key for one call, the step's for another) would take the
// second call for a repeat of the first.
func TestStepKeyDiffersFromOperationKeyForAnEmptyName(t *testing.T) {
	s := newStore[string](t, idem.Options{})
	var opKey, stepKey string
	var stepErr error
	_, err := s.RunOnce(context.Background(), "k", "p", func(ctx context.Context) (string, error) {
		opKey = idem.OperationKey(ctx)
		_, stepErr = idem.Step(ctx, "", func(ctx context.Context) (int, error) {
			stepKey = idem.StepKey(ctx)
			return 0, nil
		})
		return "", nil
	})
	require.NoError(t, err)
	if stepErr == nil {
		assert.NotEqual(t, opKey, stepKey, "a step's derived key equals the operation's")
	}
}

// A replayed Ticket's Context belongs to no operation (Context's doc: "For
// a replayed ticket it is Begin's ctx"), whether the replay came from
// memory or from the Backend: Step must refuse rather than run a side
// effect for an operation that is over.
func TestStepOnAReplayedTicketIsRefused(t *testing.T) {
	b := openBolt(t)
	s := newStore[string](t, idem.Options{Backend: b, Resume: true})
	_, err := s.RunOnce(context.Background(), "k", "p", func(context.Context) (string, error) { return "done", nil })
	require.NoError(t, err)
	tk, err := s.Begin(context.Background(), "k", "p")
	require.NoError(t, err)
	replayed := tk.Replayed()
	require.True(t, replayed)
	ran := false
	_, err = idem.Step(tk.Context(), "x", func(context.Context) (int, error) { ran = true; return 0, nil })
	assert.ErrorIs(t, err, idem.ErrNoOperation)
	assert.False(t, ran, "a step ran for a replayed operation")
	assert.Equal(t, "", idem.OperationKey(tk.Context()))
}

// Step called with the operation's ctx after fn returned (a goroutine that
// kept it): the operation is completed, so the step must not run; Step
// says so before calling fn, and the record's steps are unchanged.
func TestStepAfterOperationReturnedDoesNotRun(t *testing.T) {
	b := openBolt(t)
	s := newStore[string](t, idem.Options{Backend: b, Resume: true})
	var kept context.Context
	_, err := s.RunOnce(context.Background(), "k", "p", func(ctx context.Context) (string, error) {
		kept = ctx
		_, err := idem.Step(ctx, "a", func(context.Context) (int, error) { return 1, nil })
		return "done", err
	})
	require.NoError(t, err)
	var ran atomic.Bool
	_, err = idem.Step(kept, "late", func(context.Context) (int, error) { ran.Store(true); return 1, nil })
	assert.ErrorContains(t, err, "after its operation ended")
	assert.False(t, ran.Load(), "a step ran after its operation ended")
	rec, _, err := b.Get(context.Background(), "k", time.Now())
	require.NoError(t, err)
	require.Len(t, rec.Steps, 1)
	assert.Equal(t, "a", rec.Steps[0].Name)
}
