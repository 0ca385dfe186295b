package idem_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Options.Now is documented as the clock for a backend local to the
// process (bolt), and tests are told to inject a fake clock there instead
// of sleeping. With a clock that does not move by itself, the retry after
// an ordinary error resumes at once: the failed run's lease lapses without
// the clock moving (renewed to 1ns, it would lapse only once that clock
// moved, and the retry would find the key in flight until its ctx ended).
func TestResumeAfterErrorWithFakeClockIsImmediate(t *testing.T) {
	for _, tc := range stepBackends {
		t.Run(tc.name, func(t *testing.T) {
			clock := idemtest.NewClock(time.Now().UTC().Truncate(time.Second))
			s := newStore[string](t, idem.Options{Backend: tc.b(t), Resume: true, Now: clock.Now})
			atRecoveryPoint(t, s, "k", "p")
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			var reran atomic.Bool
			got, err := s.RunOnce(ctx, "k", "p", func(ctx context.Context) (string, error) {
				v, err := idem.Step(ctx, "a", func(context.Context) (int, error) { reran.Store(true); return 2, nil })
				return fmt.Sprint(v), err
			})
			require.NoError(t, err, "the retry resumes at once, as the README promises")
			assert.Equal(t, "1", got)
			assert.False(t, reran.Load())
		})
	}
}

// A key at its recovery point, retried with another payload, is
// ErrPayloadMismatch, not a resume; the right payload then resumes.
func TestResumeWithOtherPayloadIsMismatch(t *testing.T) {
	b := openBolt(t)
	s := newStore[string](t, idem.Options{Backend: b, Resume: true, RetryInterrupted: true})
	atRecoveryPoint(t, s, "k", "p")
	called := false
	_, err := s.RunOnce(context.Background(), "k", "other", func(context.Context) (string, error) { called = true; return "", nil })
	assert.ErrorIs(t, err, idem.ErrPayloadMismatch)
	assert.False(t, called)
	// Resume with RetryInterrupted also set: resumed, the step not rerun.
	got, err := s.RunOnce(context.Background(), "k", "p", func(ctx context.Context) (string, error) {
		v, err := idem.Step(ctx, "a", func(context.Context) (int, error) { return 5, nil })
		return fmt.Sprint(v), err
	})
	require.NoError(t, err)
	assert.Equal(t, "1", got)
}

// A stale owner whose lease lapsed (by the store's clock) and whose key
// another store resumed can neither record a step nor complete: the
// resumer's outcome stands.
func TestStaleOwnerCannotWriteAfterAnotherResumes(t *testing.T) {
	mem := idemtest.NewMemoryBackend()
	clock := idemtest.NewClock(time.Now().UTC().Truncate(time.Second))
	// The stale owner is cut off from the backend (its renewals fail), so
	// that, once the clock steps past its lease, the other store sees the
	// lapsed claim go unrenewed and takes it over (a live owner's renewal
	// would keep it: TestClockStepForwardDoesNotTakeALiveOwnersKey).
	opts := idem.Options{Backend: mem, Resume: true, Now: clock.Now, Lease: 300 * time.Millisecond}
	fresh := newStore[string](t, opts)
	var un idemtest.Unrecorded
	opts.Observer = un.Observer()
	opts.Backend = idemtest.Faulty{Backend: mem, Fail: func(op string) error {
		if op == "Renew" {
			return errors.New("partitioned")
		}
		return nil
	}}
	stale := newStore[string](t, opts)
	atGate, wake := make(chan struct{}), make(chan struct{})
	var lateStep error
	done := make(chan stepOutcome, 1)
	go func() {
		v, err := stale.RunOnce(context.Background(), "k", "p", func(ctx context.Context) (string, error) {
			if _, err := idem.Step(ctx, "a", func(context.Context) (int, error) { return 1, nil }); err != nil {
				return "", err
			}
			close(atGate)
			<-wake
			_, lateStep = idem.Step(ctx, "late", func(context.Context) (int, error) { return 1, nil })
			return "stale", nil
		})
		done <- stepOutcome{v, err}
	}()
	<-atGate
	clock.Advance(2 * time.Hour) // the stale owner's lease lapsed
	got, err := fresh.RunOnce(context.Background(), "k", "p", func(ctx context.Context) (string, error) {
		_, err := idem.Step(ctx, "a", func(context.Context) (int, error) { return 2, nil })
		return "fresh", err
	})
	require.NoError(t, err)
	assert.Equal(t, "fresh", got)
	close(wake)
	r := <-done
	// Refused: its trust ended before the other store took the key over
	// (TestPartitionedOwnerKeepsItsKeyThroughAClockStep), or the backend
	// refuses its token.
	assert.True(t, errors.Is(lateStep, idem.ErrLeaseLost) || errors.Is(lateStep, backend.ErrNotOwner), "late step: %v", lateStep)
	assert.NoError(t, r.err, "the stale owner's work took effect: it is answered")
	assert.ErrorIs(t, un.Of("k"), backend.ErrNotOwner, "the stale owner's outcome is not recorded")
	rec, _, err := mem.Get(context.Background(), "k", clock.Now())
	require.NoError(t, err)
	assert.Equal(t, backend.StateCompleted, rec.State)
	assert.Equal(t, `"fresh"`, string(rec.Value))
	for _, st := range rec.Steps {
		assert.NotEqual(t, "late", st.Name)
	}
}

// A step that panics after an earlier step was recorded: the panic is a
// *PanicError, the key stays at its recovery point, and the next call
// resumes without running the recorded step.
func TestStepPanicKeepsRecoveryPoint(t *testing.T) {
	b := openBolt(t)
	s := newStore[string](t, idem.Options{Backend: b, Resume: true})
	var aRuns, bRuns atomic.Int32
	panicNow := true
	fn := func(ctx context.Context) (string, error) {
		if _, err := idem.Step(ctx, "a", func(context.Context) (int, error) { aRuns.Add(1); return 1, nil }); err != nil {
			return "", err
		}
		return idem.Step(ctx, "b", func(context.Context) (string, error) {
			bRuns.Add(1)
			if panicNow {
				panic("bank client bug")
			}
			return "ok", nil
		})
	}
	_, err := s.RunOnce(context.Background(), "k", "p", fn)
	var pe *idem.PanicError
	require.ErrorAs(t, err, &pe)
	rec, ok, err := b.Get(context.Background(), "k", time.Now())
	require.NoError(t, err)
	require.True(t, ok, "kept at its recovery point")
	assert.Len(t, rec.Steps, 1)
	panicNow = false
	got, err := s.RunOnce(context.Background(), "k", "p", fn)
	require.NoError(t, err)
	assert.Equal(t, "ok", got)
	assert.Equal(t, int32(1), aRuns.Load())
	assert.Equal(t, int32(2), bRuns.Load())
}

// Begin/Ticket users: Step under Ticket.Context() records; a panic caught
// by the deferred Release keeps the recovery point; the next Begin resumes.
func TestTicketStepsResumeAfterRelease(t *testing.T) {
	b := openBolt(t)
	s := newStore[string](t, idem.Options{Backend: b, Resume: true})
	var aRuns atomic.Int32
	work := func(boom bool) (got string, err error) {
		defer func() {
			if p := recover(); p != nil {
				err = fmt.Errorf("panicked: %v", p)
			}
		}()
		tk, err := s.Begin(context.Background(), "k", "p")
		if err != nil {
			return "", err
		}
		defer tk.Release()
		if tk.Replayed() {
			v, err := tk.Result()
			return v, err
		}
		v, err := idem.Step(tk.Context(), "a", func(context.Context) (int, error) { aRuns.Add(1); return 3, nil })
		if err != nil {
			return tk.Finish("", err)
		}
		if boom {
			panic("consumer bug")
		}
		return tk.Finish(fmt.Sprint(v), nil)
	}
	_, err := work(true)
	require.Error(t, err)
	got, err := work(false)
	require.NoError(t, err)
	assert.Equal(t, "3", got)
	assert.Equal(t, int32(1), aRuns.Load(), "the step recorded before the panic did not run again")
}

// README: "an interrupted key keeps [its steps] until it resumes, as it
// never expires on its own". A key at its recovery point, long past its
// TTL and swept, still resumes without rerunning its recorded step.
func TestRecoveryPointOutlivesTTLAndSweep(t *testing.T) {
	for _, tc := range stepBackends {
		t.Run(tc.name, func(t *testing.T) {
			clock := idemtest.NewClock(time.Now().UTC().Truncate(time.Second))
			s := newStore[string](t, idem.Options{Backend: tc.b(t), Resume: true, Now: clock.Now, TTL: time.Hour, SweepInterval: -1})
			atRecoveryPoint(t, s, "k", "p")
			clock.Advance(48 * time.Hour)
			_, err := s.Sweep(context.Background())
			require.NoError(t, err)
			var reran atomic.Bool
			got, err := s.RunOnce(context.Background(), "k", "p", func(ctx context.Context) (string, error) {
				v, err := idem.Step(ctx, "a", func(context.Context) (int, error) { reran.Store(true); return 2, nil })
				return fmt.Sprint(v), err
			})
			require.NoError(t, err)
			assert.Equal(t, "1", got)
			assert.False(t, reran.Load())
		})
	}
}

// README: steps "go with [the record] when the outcome expires (TTL) or
// the key is forgotten": the next operation under the key runs its steps
// afresh, never replaying a step of the operation before.
func TestStepsGoWithExpiryAndForget(t *testing.T) {
	for _, tc := range stepBackends {
		t.Run(tc.name, func(t *testing.T) {
			clock := idemtest.NewClock(time.Now().UTC().Truncate(time.Second))
			s := newStore[string](t, idem.Options{Backend: tc.b(t), Resume: true, Now: clock.Now, TTL: time.Hour, SweepInterval: -1})
			run := func(v int) string {
				got, err := s.RunOnce(context.Background(), "k", "p", func(ctx context.Context) (string, error) {
					n, err := idem.Step(ctx, "a", func(context.Context) (int, error) { return v, nil })
					return fmt.Sprint(n), err
				})
				require.NoError(t, err)
				return got
			}
			assert.Equal(t, "1", run(1))
			clock.Advance(2 * time.Hour)
			assert.Equal(t, "2", run(2), "after expiry, the step runs afresh")

			atRecoveryPoint(t, s, "k2", "p")
			clock.Advance(time.Second)
			require.NoError(t, s.Forget(context.Background(), "k2"))
			got, err := s.RunOnce(context.Background(), "k2", "p", func(ctx context.Context) (string, error) {
				n, err := idem.Step(ctx, "a", func(context.Context) (int, error) { return 3, nil })
				return fmt.Sprint(n), err
			})
			require.NoError(t, err)
			assert.Equal(t, "3", got, "after Forget, the step runs afresh")
		})
	}
}
