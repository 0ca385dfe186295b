package idem_test

import (
	"context"
	"errors"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/bolt"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// stepOrder is what the steps of the tests' operation return.
type stepOrder struct {
	ID    int
	Total float64
	Note  string
}

// threeSteps is an operation of three steps, each counting its runs; gate,
// if set, is called between steps two and three.
type threeSteps struct {
	runs [3]atomic.Int32
	gate func(ctx context.Context) error
}

func (o *threeSteps) fn(ctx context.Context) (string, error) {
	a, err := idem.Step(ctx, "create-order", func(ctx context.Context) (stepOrder, error) {
		o.runs[0].Add(1)
		return stepOrder{ID: 7, Total: 450.5, Note: "dosa-mix \"x2\""}, nil
	})
	if err != nil {
		return "", err
	}
	b, err := idem.Step(ctx, "charge", func(ctx context.Context) (string, error) {
		o.runs[1].Add(1)
		return "charge-" + idem.StepKey(ctx)[:8], nil
	})
	if err != nil {
		return "", err
	}
	if o.gate != nil {
		if err := o.gate(ctx); err != nil {
			return "", err
		}
	}
	c, err := idem.Step(ctx, "notify", func(ctx context.Context) (int, error) {
		o.runs[2].Add(1)
		return a.ID, nil
	})
	if err != nil {
		return "", err
	}
	return b + "/" + a.Note + "/" + string(rune('0'+c)), nil
}

func (o *threeSteps) counts() [3]int32 {
	return [3]int32{o.runs[0].Load(), o.runs[1].Load(), o.runs[2].Load()}
}

// An owner that dies after two steps: with Resume, the next store takes
// the key over and runs only the third step; the dead owner, if it wakes,
// can record no step.
func TestStepResumesAfterOwnerDied(t *testing.T) {
	b := idemtest.NewMemoryBackend()
	ctx := context.Background()
	first := idem.New[string](idem.Options{Backend: b, Resume: true})
	defer first.Close()
	atGate, wake := make(chan struct{}), make(chan struct{})
	var lateErr error
	op := &threeSteps{gate: func(ctx context.Context) error {
		close(atGate)
		<-wake
		// The stale owner tries one more step after another took over.
		_, lateErr = idem.Step(ctx, "late", func(context.Context) (int, error) { return 1, nil })
		return errors.New("stale owner gives up")
	}}
	done := make(chan error, 1)
	go func() { _, err := first.RunOnce(ctx, "order-101", "p", op.fn); done <- err }()
	<-atGate
	b.Crash() // as the next process finds it: the claim interrupted, two steps recorded

	second := idem.New[string](idem.Options{Backend: b, Resume: true})
	defer second.Close()
	resumed := &threeSteps{}
	got, err := second.RunOnce(ctx, "order-101", "p", resumed.fn)
	require.NoError(t, err)
	assert.Equal(t, [3]int32{0, 0, 1}, resumed.counts(), "the recorded steps returned their outcomes; only the third ran")
	assert.Equal(t, [3]int32{1, 1, 0}, op.counts())
	assert.Contains(t, got, `/dosa-mix "x2"/7`, "recorded outcomes decode through the Codec")

	close(wake)
	<-done
	assert.ErrorIs(t, lateErr, backend.ErrNotOwner, "a stale owner cannot record a step")
	rec, _, err := b.Get(ctx, "order-101", time.Now())
	require.NoError(t, err)
	assert.Equal(t, backend.StateCompleted, rec.State)
	for _, s := range rec.Steps {
		assert.NotEqual(t, "late", s.Name)
	}
	again, err := second.RunOnce(ctx, "order-101", "p", resumed.fn)
	require.NoError(t, err)
	assert.Equal(t, got, again, "then the outcome replays")
}

// An ordinary error after a step keeps the key at its recovery point: the
// retry runs on from the failed step, never the recorded ones again.
func TestStepErrorKeepsRecoveryPoint(t *testing.T) {
	b := idemtest.NewMemoryBackend()
	s := idem.New[string](idem.Options{Backend: b, Resume: true})
	defer s.Close()
	ctx := context.Background()
	failures := 2
	op := &threeSteps{gate: func(context.Context) error {
		if failures > 0 {
			failures--
			return errors.New("the bank is unavailable")
		}
		return nil
	}}
	for range 2 {
		_, err := s.RunOnce(ctx, "k", "p", op.fn)
		require.Error(t, err)
		rec, ok, gerr := b.Get(ctx, "k", time.Now())
		require.NoError(t, gerr)
		require.True(t, ok, "the key is not released")
		assert.Equal(t, backend.StateInterrupted, rec.State, "its lease lapsed at once")
		assert.Len(t, rec.Steps, 2)
	}
	_, err := s.RunOnce(ctx, "k", "p", op.fn)
	require.NoError(t, err)
	assert.Equal(t, [3]int32{1, 1, 1}, op.counts(), "each step ran once over three calls")
}

// Without Resume, steps record nothing and an interrupted key is
// ErrOutcomeUnknown, as it always was.
func TestStepWithoutResumeIsAsBefore(t *testing.T) {
	b := idemtest.NewMemoryBackend()
	ctx := context.Background()
	first := idem.New[string](idem.Options{Backend: b})
	defer first.Close()
	atGate, wake := make(chan struct{}), make(chan struct{})
	op := &threeSteps{gate: func(context.Context) error { close(atGate); <-wake; return errors.New("gone") }}
	go func() { _, _ = first.RunOnce(ctx, "k", "p", op.fn) }()
	<-atGate
	b.Crash()
	rec, _, err := b.Get(ctx, "k", time.Now())
	require.NoError(t, err)
	assert.Empty(t, rec.Steps, "nothing recorded without Resume")
	second := idem.New[string](idem.Options{Backend: b})
	defer second.Close()
	_, err = second.RunOnce(ctx, "k", "p", (&threeSteps{}).fn)
	assert.ErrorIs(t, err, idem.ErrOutcomeUnknown)
	close(wake)
}

// Keys derived for other services: stable, distinct per key and per step.
func TestStepKeys(t *testing.T) {
	s := idem.New[string](idem.Options{})
	defer s.Close()
	ctx := context.Background()
	keys := func(key string) (op, step string) {
		_, err := s.RunOnce(ctx, key, "p", func(ctx context.Context) (string, error) {
			op = idem.OperationKey(ctx)
			_, err := idem.Step(ctx, "charge", func(ctx context.Context) (int, error) {
				step = idem.StepKey(ctx)
				return 0, nil
			})
			assert.NoError(t, err)
			assert.Equal(t, op, idem.StepKey(ctx), "outside a step, StepKey is the operation's")
			return "", errors.New("release, so the next call runs again")
		})
		require.Error(t, err)
		return op, step
	}
	op1, step1 := keys("order-101")
	op2, step2 := keys("order-101")
	op3, step3 := keys("order-102")
	assert.Equal(t, op1, op2)
	assert.Equal(t, step1, step2, "the same on every run")
	assert.NotEqual(t, op1, op3)
	assert.NotEqual(t, step1, step3)
	assert.NotEqual(t, op1, step1)
	assert.Len(t, step1, 36)
	assert.Equal(t, "", idem.StepKey(ctx), "outside an operation")
	assert.Equal(t, "", idem.OperationKey(ctx))
	_, err := idem.Step(ctx, "x", func(context.Context) (int, error) { return 1, nil })
	assert.ErrorIs(t, err, idem.ErrNoOperation)
}

// A step's recorded result survives a restart of a bolt file byte for
// byte, through the Codec, and a resumed run returns it.
func TestStepResultSurvivesRestart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "idem.db")
	b, err := bolt.Open(path, nil)
	require.NoError(t, err)
	ctx := context.Background()
	s := idem.New[string](idem.Options{Backend: b, Resume: true})
	want := stepOrder{ID: 1 << 40, Total: 0.1 + 0.2, Note: "é\u2028\x00"}
	_, err = s.RunOnce(ctx, "k", "p", func(ctx context.Context) (string, error) {
		if _, err := idem.Step(ctx, "create-order", func(context.Context) (stepOrder, error) { return want, nil }); err != nil {
			return "", err
		}
		return "", errors.New("stop at the recovery point")
	})
	require.Error(t, err)
	require.NoError(t, s.Close())
	require.NoError(t, b.Close())

	b, err = bolt.Open(path, nil)
	require.NoError(t, err)
	defer b.Close()
	s = idem.New[string](idem.Options{Backend: b, Resume: true})
	defer s.Close()
	var got stepOrder
	_, err = s.RunOnce(ctx, "k", "p", func(ctx context.Context) (string, error) {
		got, err = idem.Step(ctx, "create-order", func(context.Context) (stepOrder, error) {
			return stepOrder{}, errors.New("ran again")
		})
		return "", err
	})
	require.NoError(t, err)
	assert.Equal(t, want, got)
}

// plainBackend hides its backend's Stepper methods.
type plainBackend struct{ backend.Backend }

// Resume with no Backend, or one that records no steps, cannot do what
// it asks: every RunOnce and Begin says so, and no fn runs, rather than
// run without the recovery points the caller counts on.
func TestResumeWithoutStepperIsRefused(t *testing.T) {
	for name, b := range map[string]backend.Backend{
		"no backend":              nil,
		"a backend with no steps": plainBackend{idemtest.NewMemoryBackend()},
	} {
		t.Run(name, func(t *testing.T) {
			s := idem.New[string](idem.Options{Backend: b, Resume: true})
			defer s.Close()
			_, err := s.RunOnce(context.Background(), "k", "p", func(context.Context) (string, error) {
				t.Error("fn ran")
				return "", nil
			})
			require.ErrorContains(t, err, "Options.Resume needs a Backend that records steps")
			_, err = s.Begin(context.Background(), "k", "p")
			require.ErrorContains(t, err, "backend.Stepper")
		})
	}
	// idemtest.Faulty passes the Stepper through, so fault tests of Resume
	// test it; over a backend with no steps it is refused all the same.
	over := idem.New[string](idem.Options{Backend: idemtest.Faulty{Backend: plainBackend{idemtest.NewMemoryBackend()}}, Resume: true})
	defer over.Close()
	_, err := over.RunOnce(context.Background(), "k", "p", (&threeSteps{}).fn)
	require.ErrorContains(t, err, "backend.Stepper")
	s := idem.New[string](idem.Options{Backend: idemtest.Faulty{Backend: idemtest.NewMemoryBackend()}, Resume: true})
	defer s.Close()
	_, err = s.RunOnce(context.Background(), "k", "p", (&threeSteps{}).fn)
	require.NoError(t, err)
}

// A step whose fn ends its goroutine (runtime.Goexit, as t.FailNow does)
// gives the callers waiting on the same name an error, not a zero success.
func TestStepGoexitTellsTheWaiters(t *testing.T) {
	s := idem.New[string](idem.Options{})
	defer s.Close()
	var waiterErr error
	_, _ = s.RunOnce(context.Background(), "k", "p", func(ctx context.Context) (string, error) {
		inside, exited := make(chan struct{}), make(chan struct{})
		go func() {
			defer close(exited)
			_, _ = idem.Step(ctx, "s", func(context.Context) (int, error) {
				close(inside)
				runtime.Goexit()
				return 1, nil
			})
		}()
		<-inside
		<-exited
		_, waiterErr = idem.Step(ctx, "s", func(context.Context) (int, error) { return 2, nil })
		return "", nil
	})
	assert.ErrorContains(t, waiterErr, "exited its goroutine")
}
