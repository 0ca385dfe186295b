// Package txtest is the behaviour suite that every RunOnceTx (sqlite,
// bolt) must pass: the key, the caller's writes and the outcome commit
// together or not at all, and duplicates run fn once. Each backend's
// tests run it with a Harness; the crash cases (a SIGKILLed process) live
// beside each backend, since they need its test binary as the child.
package txtest

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/seed094d4201/idem/internal/txrun"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A Harness adapts one backend's RunOnceTx to the suite.
type Harness struct {
	// New returns a store over a new, empty database whose Backend
	// RunOnceTx needs, and a func that counts the caller's rows in it.
	New func(t *testing.T, opts idem.Options) (s *idem.Store[int], rows func() int)

	// RunOnceTx calls the backend's RunOnceTx with fn. Inside fn, write
	// adds one of the caller's rows in fn's transaction and returns its id
	// (ids are distinct and positive).
	RunOnceTx func(ctx context.Context, s *idem.Store[int], key string, payload any, fn func(ctx context.Context, write func() (int, error)) (int, error)) (int, error)

	// ServerClock: the backend judges expiry by its server's clock, not
	// by Options.Now (mysql), so expiry is waited for, not stepped.
	ServerClock bool
}

// Run runs the suite.
func Run(t *testing.T, h Harness) {
	for _, tc := range []struct {
		name string
		test func(*testing.T, Harness)
	}{
		{"SuccessCommitsKeyAndWrites", testSuccess},
		{"ErrorLeavesNeither", testError},
		{"PanicLeavesNeither", testPanic},
		{"GoexitLeavesNeither", testGoexit},
		{"FinalErrorKeepsKeyNotWrites", testFinal},
		{"ConcurrentDuplicatesRunOnce", testDuplicates},
		{"ManyKeysAtOnce", testManyKeys},
		{"CallerLeavingDoesNotStopIt", testCallerLeaves},
		{"PlainRunOnceOnTheSameKey", testPlainRunOnce},
		{"ExpiredKeyRunsAgain", testExpired},
		{"BadInput", testBadInput},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.test(t, h) })
	}
}

// keyState is the state of key's record in s's Backend, or "free".
func keyState(t *testing.T, s *idem.Store[int], key string) string {
	t.Helper()
	rec, ok, err := txrun.Of(s).Options().Backend.Get(context.Background(), key, txrun.Of(s).Options().Now())
	require.NoError(t, err)
	if !ok {
		return "free"
	}
	return rec.State.String()
}

func writeOne(ctx context.Context, write func() (int, error)) (int, error) { return write() }

func testSuccess(t *testing.T, h Harness) {
	s, rows := h.New(t, idem.Options{})
	ctx := context.Background()
	id, err := h.RunOnceTx(ctx, s, "ok", "p", writeOne)
	require.NoError(t, err)
	assert.Positive(t, id)
	assert.Equal(t, 1, rows(), "the caller's row")
	assert.Equal(t, "completed", keyState(t, s, "ok"), "and the key")

	var calls atomic.Int32
	again, err := h.RunOnceTx(ctx, s, "ok", "p", func(ctx context.Context, w func() (int, error)) (int, error) {
		calls.Add(1)
		return w()
	})
	require.NoError(t, err)
	assert.Equal(t, id, again, "a retry replays the first result")
	assert.Zero(t, calls.Load(), "without running fn")
	assert.Equal(t, 1, rows())

	_, err = h.RunOnceTx(ctx, s, "ok", "other payload", writeOne)
	assert.ErrorIs(t, err, idem.ErrPayloadMismatch)
	assert.Equal(t, 1, rows())
}

// failNext checks that a failed call left neither the row nor the key, and
// that the next call runs.
func failNext(t *testing.T, h Harness, s *idem.Store[int], rows func() int, key string) {
	t.Helper()
	assert.Equal(t, 0, rows(), "no row of the failed call")
	assert.Equal(t, "free", keyState(t, s, key), "and the key is free, not interrupted")
	id, err := h.RunOnceTx(context.Background(), s, key, "p", writeOne)
	require.NoError(t, err, "the next call runs")
	assert.Positive(t, id)
	assert.Equal(t, 1, rows())
}

func testError(t *testing.T, h Harness) {
	s, rows := h.New(t, idem.Options{})
	boom := errors.New("stock service said: try later")
	_, err := h.RunOnceTx(context.Background(), s, "k", "p", func(ctx context.Context, w func() (int, error)) (int, error) {
		if _, err := w(); err != nil {
			return 0, err
		}
		return 0, boom
	})
	assert.ErrorIs(t, err, boom)
	failNext(t, h, s, rows, "k")
}

func testPanic(t *testing.T, h Harness) {
	s, rows := h.New(t, idem.Options{})
	_, err := h.RunOnceTx(context.Background(), s, "k", "p", func(ctx context.Context, w func() (int, error)) (int, error) {
		_, _ = w()
		panic("bug in fn")
	})
	var pe *idem.PanicError
	require.ErrorAs(t, err, &pe)
	assert.Equal(t, "bug in fn", pe.Value)
	failNext(t, h, s, rows, "k")
}

func testGoexit(t *testing.T, h Harness) {
	s, rows := h.New(t, idem.Options{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = h.RunOnceTx(context.Background(), s, "k", "p", func(ctx context.Context, w func() (int, error)) (int, error) {
			_, _ = w()
			runtimeGoexit() // as t.FailNow does
			return 0, nil
		})
	}()
	<-done
	failNext(t, h, s, rows, "k")
}

func testFinal(t *testing.T, h Harness) {
	s, rows := h.New(t, idem.Options{})
	var calls atomic.Int32
	declined := func(ctx context.Context, w func() (int, error)) (int, error) {
		calls.Add(1)
		_, _ = w()
		return 0, idem.Final(errors.New("card declined"))
	}
	_, err := h.RunOnceTx(context.Background(), s, "k", "p", declined)
	assert.True(t, idem.IsFinal(err), "%v", err)
	_, err = h.RunOnceTx(context.Background(), s, "k", "p", declined)
	assert.EqualError(t, err, "card declined", "the retry replays the final error")
	assert.True(t, idem.IsFinal(err))
	assert.Equal(t, int32(1), calls.Load())
	assert.Equal(t, 0, rows(), "fn's writes were rolled back")
	assert.Equal(t, "completed", keyState(t, s, "k"), "the key and its error were kept")
}

func testDuplicates(t *testing.T, h Harness) {
	s, rows := h.New(t, idem.Options{})
	const callers = 50
	var calls atomic.Int32
	start := make(chan struct{})
	var wg sync.WaitGroup
	ids := make([]int, callers)
	errs := make([]error, callers)
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			ids[i], errs[i] = h.RunOnceTx(context.Background(), s, "dup", "p", func(ctx context.Context, w func() (int, error)) (int, error) {
				calls.Add(1)
				return w()
			})
		}()
	}
	close(start)
	wg.Wait()
	for i := range callers {
		require.NoError(t, errs[i])
		assert.Equal(t, ids[0], ids[i], "every caller gets the one result")
	}
	assert.Equal(t, int32(1), calls.Load(), "fn ran once for %d callers", callers)
	assert.Equal(t, 1, rows())
}

// Many keys at once, some failing: every success leaves exactly its row and
// key, every failure neither.
func testManyKeys(t *testing.T, h Harness) {
	s, rows := h.New(t, idem.Options{})
	const keys = 64
	var wg sync.WaitGroup
	start := make(chan struct{})
	errs := make([]error, keys)
	for i := range keys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, errs[i] = h.RunOnceTx(context.Background(), s, fmt.Sprintf("k%03d", i), i, func(ctx context.Context, w func() (int, error)) (int, error) {
				id, err := w()
				if err == nil && i%4 == 3 {
					err = errors.New("fails")
				}
				return id, err
			})
		}()
	}
	close(start)
	wg.Wait()
	ok := 0
	for i := range keys {
		if i%4 == 3 {
			assert.Error(t, errs[i])
			assert.Equal(t, "free", keyState(t, s, fmt.Sprintf("k%03d", i)))
			continue
		}
		require.NoError(t, errs[i])
		assert.Equal(t, "completed", keyState(t, s, fmt.Sprintf("k%03d", i)))
		ok++
	}
	assert.Equal(t, ok, rows(), "one row per success, none per failure")
}

// A caller whose ctx ends while fn runs gets ErrInProgress; fn goes on and
// commits, and the next call replays.
func testCallerLeaves(t *testing.T, h Harness) {
	s, rows := h.New(t, idem.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	started, release := make(chan struct{}), make(chan struct{})
	res := make(chan error, 1)
	go func() {
		_, err := h.RunOnceTx(ctx, s, "k", "p", func(fctx context.Context, w func() (int, error)) (int, error) {
			close(started)
			<-release
			if err := fctx.Err(); err != nil {
				return 0, fmt.Errorf("fn's context ended with the caller's: %w", err)
			}
			return w()
		})
		res <- err
	}()
	<-started
	cancel()
	err := <-res
	assert.ErrorIs(t, err, idem.ErrInProgress)
	assert.ErrorIs(t, err, context.Canceled)
	close(release)
	id, err := h.RunOnceTx(context.Background(), s, "k", "p", func(context.Context, func() (int, error)) (int, error) {
		return 0, errors.New("ran again")
	})
	require.NoError(t, err)
	assert.Positive(t, id)
	assert.Equal(t, 1, rows())
}

// RunOnceTx and RunOnce on one key of one store coalesce: fn runs once.
func testPlainRunOnce(t *testing.T, h Harness) {
	s, rows := h.New(t, idem.Options{})
	started, release := make(chan struct{}), make(chan struct{})
	res := make(chan error, 1)
	go func() {
		_, err := h.RunOnceTx(context.Background(), s, "k", "p", func(ctx context.Context, w func() (int, error)) (int, error) {
			close(started)
			<-release
			return w()
		})
		res <- err
	}()
	<-started
	plain := make(chan int, 1)
	go func() {
		v, err := s.RunOnce(context.Background(), "k", "p", func(context.Context) (int, error) { return -1, nil })
		assert.NoError(t, err)
		plain <- v
	}()
	close(release)
	require.NoError(t, <-res)
	assert.Positive(t, <-plain, "RunOnce waited for RunOnceTx's outcome")
	assert.Equal(t, 1, rows())

	// And the other way round: a key that RunOnce holds is not run by
	// RunOnceTx.
	started2, release2 := make(chan struct{}), make(chan struct{})
	go func() {
		_, _ = s.RunOnce(context.Background(), "k2", "p", func(context.Context) (int, error) {
			close(started2)
			<-release2
			return 42, nil
		})
	}()
	<-started2
	txv := make(chan int, 1)
	go func() {
		v, err := h.RunOnceTx(context.Background(), s, "k2", "p", writeOne)
		assert.NoError(t, err)
		txv <- v
	}()
	close(release2)
	assert.Equal(t, 42, <-txv)
	assert.Equal(t, 1, rows(), "RunOnceTx's fn did not run")
}

func testExpired(t *testing.T, h Harness) {
	clock := idemtest.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	opts := idem.Options{TTL: time.Hour, Now: clock.Now, SweepInterval: -1}
	if h.ServerClock {
		opts = idem.Options{TTL: time.Second, SweepInterval: -1} // long enough that the second outlives the sweep below
	}
	s, rows := h.New(t, opts)
	first, err := h.RunOnceTx(context.Background(), s, "k", "p", writeOne)
	require.NoError(t, err)
	clock.Advance(2 * time.Hour)
	second, err := h.RunOnceTx(context.Background(), s, "k", "p", writeOne)
	require.NoError(t, err)
	for deadline := time.Now().Add(10 * time.Second); h.ServerClock && second == first && time.Now().Before(deadline); {
		second, err = h.RunOnceTx(context.Background(), s, "k", "p", writeOne) // a replay until it expires
		require.NoError(t, err)
	}
	assert.NotEqual(t, first, second, "an expired key runs again")
	assert.Equal(t, 2, rows())
	n, err := s.Sweep(context.Background())
	require.NoError(t, err)
	assert.Zero(t, n, "the new record replaced the old one's expiry entry")
	assert.Equal(t, "completed", keyState(t, s, "k"))
}

func testBadInput(t *testing.T, h Harness) {
	s, rows := h.New(t, idem.Options{})
	_, err := h.RunOnceTx(context.Background(), s, "", "p", writeOne)
	assert.ErrorIs(t, err, idem.ErrInvalidKey)
	_, err = h.RunOnceTx(context.Background(), s, "k", "p", nil)
	assert.Error(t, err, "a nil fn")
	_, err = h.RunOnceTx(context.Background(), nil, "k", "p", writeOne)
	assert.ErrorContains(t, err, "nil store")
	other := idem.New[int](idem.Options{Backend: &notOurs{}})
	defer other.Close()
	_, err = h.RunOnceTx(context.Background(), other, "k", "p", writeOne)
	assert.ErrorContains(t, err, "Backend")
	assert.Equal(t, 0, rows())
	require.NoError(t, s.Close())
	_, err = h.RunOnceTx(context.Background(), s, "k", "p", writeOne)
	assert.ErrorIs(t, err, idem.ErrClosed)
}

// notOurs is a Backend of another kind.
type notOurs struct{ backend.Backend }

// runtimeGoexit is runtime.Goexit, named for the test that calls it.
var runtimeGoexit = runtime.Goexit
