package sqlite

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

// atRecoveryPoint leaves key at a recovery point: step "a" recorded, then an
// ordinary error.
func atRecoveryPoint(t *testing.T, s *idem.Store[string], key string) {
	t.Helper()
	_, err := s.RunOnce(context.Background(), key, "p", func(ctx context.Context) (string, error) {
		if _, err := idem.Step(ctx, "a", func(context.Context) (int, error) { return 1, nil }); err != nil {
			return "", err
		}
		return "", errors.New("transient")
	})
	require.Error(t, err)
}

// sqlite takes its instants from the Store's clock (Options.Now): with an
// injected clock that does not move on its own, the retry after an
// ordinary error resumes at once. A "lapse the lease now" renewal to 1ns
// would never lapse on that clock, and the retry would wait for a key
// nobody holds until its ctx ended.
func TestResumeAfterErrorWithFakeClockIsImmediate(t *testing.T) {
	b, _ := testBackend(t)
	clock := idemtest.NewClock(time.Now().UTC().Truncate(time.Second))
	s := idem.New[string](idem.Options{Backend: b, Resume: true, Now: clock.Now})
	defer s.Close()
	atRecoveryPoint(t, s, "k")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	got, err := s.RunOnce(ctx, "k", "p", func(ctx context.Context) (string, error) {
		v, err := idem.Step(ctx, "a", func(context.Context) (int, error) { return 2, nil })
		return fmt.Sprint(v), err
	})
	require.NoError(t, err)
	assert.Equal(t, "1", got)
}

// Two processes' worth of stores (two *sql.DB over one file), four callers
// each, resume one key at once: one resume, the recorded step never again,
// the next step once, one outcome for all.
func TestTwoHandlesResumingAtOnceRunEachStepOnce(t *testing.T) {
	db1, path := openTemp(t)
	db2, err := Open(path)
	require.NoError(t, err)
	t.Cleanup(func() { _ = db2.Close() })
	b1, err := New(context.Background(), db1, Options{})
	require.NoError(t, err)
	b2, err := New(context.Background(), db2, Options{})
	require.NoError(t, err)
	s1 := idem.New[string](idem.Options{Backend: b1, Resume: true})
	defer s1.Close()
	s2 := idem.New[string](idem.Options{Backend: b2, Resume: true})
	defer s2.Close()
	atRecoveryPoint(t, s1, "k")
	var aRuns, bRuns atomic.Int32
	fn := func(ctx context.Context) (string, error) {
		a, err := idem.Step(ctx, "a", func(context.Context) (int, error) { aRuns.Add(1); return 9, nil })
		if err != nil {
			return "", err
		}
		c, err := idem.Step(ctx, "b", func(context.Context) (int, error) { bRuns.Add(1); return 2, nil })
		return fmt.Sprint(a, c), err
	}
	start := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var got []string
	var errs []error
	for i := range 8 {
		wg.Add(1)
		go func(s *idem.Store[string]) {
			defer wg.Done()
			<-start
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			v, err := s.RunOnce(ctx, "k", "p", fn)
			mu.Lock()
			got, errs = append(got, v), append(errs, err)
			mu.Unlock()
		}([]*idem.Store[string]{s1, s2}[i%2])
	}
	close(start)
	wg.Wait()
	for i := range got {
		require.NoError(t, errs[i])
		assert.Equal(t, "1 2", got[i])
	}
	assert.Equal(t, int32(0), aRuns.Load())
	assert.Equal(t, int32(1), bRuns.Load())
}

// Concurrent steps of one fn with distinct names: every one recorded (the
// read-modify-write of the steps column loses none).
func TestConcurrentStepsAreAllRecorded(t *testing.T) {
	b, _ := testBackend(t)
	s := idem.New[string](idem.Options{Backend: b, Resume: true})
	defer s.Close()
	const n = 16
	_, err := s.RunOnce(context.Background(), "k", "p", func(ctx context.Context) (string, error) {
		var wg sync.WaitGroup
		errs := make([]error, n)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, errs[i] = idem.Step(ctx, fmt.Sprint("s", i), func(context.Context) (int, error) { return i, nil })
			}()
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return "", err
		}
		return "", errors.New("transient")
	})
	require.Error(t, err)
	assert.NotContains(t, err.Error(), "recording step")
	rec, _, err := b.Get(context.Background(), "k", time.Now())
	require.NoError(t, err)
	assert.Len(t, rec.Steps, n)
}

// README: steps go with the record when its outcome expires: a completed
// key with a step, taken over after its TTL, runs the step afresh.
func TestStepsGoWithExpiry(t *testing.T) {
	b, _ := testBackend(t)
	clock := idemtest.NewClock(time.Now().UTC().Truncate(time.Second))
	s := idem.New[string](idem.Options{Backend: b, Resume: true, Now: clock.Now, TTL: time.Hour, SweepInterval: -1})
	defer s.Close()
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
	assert.Equal(t, "2", run(2))
	rec, _, err := b.Get(context.Background(), "k", clock.Now())
	require.NoError(t, err)
	assert.Len(t, rec.Steps, 1)
}
