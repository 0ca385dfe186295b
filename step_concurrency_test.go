package idem_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Step's doc: "A name is one step: the same name twice in one operation
// returns the first call's outcome." Two goroutines of one fn calling the
// same step at once must not both run it: that is the double side effect
// (a card charged twice under one derived key that the bank may or may not
// dedupe) the whole API exists to prevent.
func TestStepConcurrentSameNameRunsOnce(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts idem.Options
	}{
		{"memory-only", idem.Options{}},
		{"resume", idem.Options{Backend: idemtest.NewMemoryBackend(), Resume: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore[int](t, tc.opts)
			var runs atomic.Int32
			entered, release := make(chan struct{}), make(chan struct{})
			charge := func(ctx context.Context) (int, error) {
				if runs.Add(1) == 1 {
					close(entered)
					<-release
				}
				return 42, nil
			}
			_, err := s.RunOnce(context.Background(), "k", "p", func(ctx context.Context) (int, error) {
				first := make(chan error, 1)
				go func() { _, err := idem.Step(ctx, "charge", charge); first <- err }()
				<-entered
				second := make(chan error, 1)
				go func() { _, err := idem.Step(ctx, "charge", charge); second <- err }()
				// The second call may not return before the first's fn has:
				// a second run of the step returns at once.
				deadline := time.Now().Add(300 * time.Millisecond)
				for time.Now().Before(deadline) && runs.Load() == 1 {
					time.Sleep(time.Millisecond) // polling a condition with a deadline
				}
				close(release)
				return 0, errors.Join(<-first, <-second)
			})
			require.NoError(t, err)
			assert.Equal(t, int32(1), runs.Load(), "the step ran once for two concurrent calls of one name")
		})
	}
}

// Two stores over one bolt file, four callers each, all retrying one key
// at its recovery point at once: exactly one resumes, the recorded step
// never runs again, the next step runs once, everyone gets its outcome.
func TestTwoStoresResumingAtOnceRunEachStepOnce(t *testing.T) {
	b := openBolt(t)
	stores := []*idem.Store[string]{
		newStore[string](t, idem.Options{Backend: b, Resume: true}),
		newStore[string](t, idem.Options{Backend: b, Resume: true}),
	}
	atRecoveryPoint(t, stores[0], "k", "p")
	var aRuns, bRuns, bodies atomic.Int32
	fn := func(ctx context.Context) (string, error) {
		bodies.Add(1)
		a, err := idem.Step(ctx, "a", func(context.Context) (int, error) { aRuns.Add(1); return 9, nil })
		if err != nil {
			return "", err
		}
		c, err := idem.Step(ctx, "b", func(context.Context) (string, error) { bRuns.Add(1); return idem.StepKey(ctx), nil })
		return fmt.Sprint(a, "/", c), err
	}
	start := make(chan struct{})
	var wg sync.WaitGroup
	results := make(chan stepOutcome, 8)
	for i := range 8 {
		wg.Add(1)
		go func(s *idem.Store[string]) {
			defer wg.Done()
			<-start
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			v, err := s.RunOnce(ctx, "k", "p", fn)
			results <- stepOutcome{v, err}
		}(stores[i%2])
	}
	close(start)
	wg.Wait()
	close(results)
	var first string
	for r := range results {
		require.NoError(t, r.err)
		if first == "" {
			first = r.val
		}
		assert.Equal(t, first, r.val)
	}
	assert.Equal(t, int32(0), aRuns.Load(), "the recorded step never ran again")
	assert.Equal(t, int32(1), bRuns.Load(), "the next step ran once")
	assert.Equal(t, int32(1), bodies.Load(), "one resumed execution")
}

// Many steps recorded concurrently from goroutines of one fn, with
// distinct names: all are recorded (no lost update in the record's read-
// modify-write), and none runs again on the resumed run.
func TestConcurrentDistinctStepsAreAllRecorded(t *testing.T) {
	b := openBolt(t)
	s := newStore[string](t, idem.Options{Backend: b, Resume: true})
	const n = 32
	var runs [n]atomic.Int32
	fn := func(fail bool) func(ctx context.Context) (string, error) {
		return func(ctx context.Context) (string, error) {
			var wg sync.WaitGroup
			errs := make([]error, n)
			for i := range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, errs[i] = idem.Step(ctx, fmt.Sprint("s", i), func(context.Context) (int, error) { runs[i].Add(1); return i, nil })
				}()
			}
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				return "", err
			}
			if fail {
				return "", errors.New("transient")
			}
			return "done", nil
		}
	}
	_, err := s.RunOnce(context.Background(), "k", "p", fn(true))
	require.Error(t, err)
	rec, _, err := b.Get(context.Background(), "k", time.Now())
	require.NoError(t, err)
	assert.Len(t, rec.Steps, n)
	_, err = s.RunOnce(context.Background(), "k", "p", fn(false))
	require.NoError(t, err)
	for i := range n {
		assert.Equal(t, int32(1), runs[i].Load(), "step %d", i)
	}
}
