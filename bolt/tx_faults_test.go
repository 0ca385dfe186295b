package bolt

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	bbolt "go.etcd.io/bbolt"
)

// As in package sqlite's test: fn calls runtime.Goexit while the caller's
// ctx can end but has not.
func TestGoexitInFnWithCancellableCtxAnswersTheCaller(t *testing.T) {
	b, _ := openTemp(t, nil)
	s := idem.New[int](idem.Options{Backend: b})
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	done := make(chan struct{})
	var err error
	go func() {
		defer close(done)
		_, err = RunOnceTx(ctx, s, "k", "p", func(ctx context.Context, tx *bbolt.Tx) (int, error) {
			runtime.Goexit()
			return 0, nil
		})
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		cancel()
		<-done
		t.Fatalf("RunOnceTx whose fn called runtime.Goexit waited for the caller's ctx to end; it returned %v only then", err)
	}
	_, found, gerr := b.Get(context.Background(), "k", time.Now())
	require.NoError(t, gerr)
	assert.False(t, found)
}

// A result larger than MaxRecordSize, which the next Open would take for
// damage, is refused when written: RunOnceTx rolls fn's writes back and
// leaves the key free; a plain RunOnce, whose fn has run, answers its
// result and keeps the key claimed (its Observer is told the outcome was
// not recorded). The file opens again either way.
func TestHugeResultIsRefused(t *testing.T) {
	huge := strings.Repeat("x", MaxRecordSize+1)
	for _, mode := range []string{"RunOnceTx", "RunOnce"} {
		t.Run(mode, func(t *testing.T) {
			b, path := openTemp(t, nil)
			var un idemtest.Unrecorded
			s := idem.New[string](idem.Options{Backend: b, Observer: un.Observer()})
			defer s.Close()
			run := func(fn func() (string, error)) (string, error) {
				if mode == "RunOnce" {
					return s.RunOnce(context.Background(), "k", "p", func(context.Context) (string, error) { return fn() })
				}
				return RunOnceTx(context.Background(), s, "k", "p", func(context.Context, *bbolt.Tx) (string, error) { return fn() })
			}
			_, err := run(func() (string, error) { return huge, nil })
			rec, found, gerr := b.Get(context.Background(), "k", time.Now())
			assert.NoError(t, gerr, "the key is readable")
			if mode == "RunOnceTx" {
				assert.ErrorIs(t, err, ErrTooLarge, "refused when written")
				assert.False(t, found, "nothing was committed: the key is free")
			} else { // fn ran: the key stays claimed, never released
				assert.NoError(t, err, "fn's success is answered")
				assert.ErrorIs(t, un.Of("k"), ErrTooLarge, "refused when written")
				assert.True(t, found)
				assert.Equal(t, "pending", rec.State.String())
			}
			require.NoError(t, s.Close())
			require.NoError(t, b.Close())
			b2, err := Open(path, nil)
			require.NoError(t, err, "a file idem wrote itself opens again")
			if err == nil {
				b2.Close()
			}
		})
	}
}

// A final error whose result the Codec cannot encode is not recorded, and
// the caller's error says so without claiming to be final: the key is
// free, and the next call runs fn again.
func TestUnrecordedFinalErrorIsNotFinal(t *testing.T) {
	b, _ := openTemp(t, nil)
	s := idem.New[float64](idem.Options{Backend: b})
	defer s.Close()
	_, err := RunOnceTx(context.Background(), s, "k", "p", func(ctx context.Context, tx *bbolt.Tx) (float64, error) {
		return math.NaN(), idem.Final(errors.New("card declined"))
	})
	_, found, gerr := b.Get(context.Background(), "k", time.Now())
	require.NoError(t, gerr)
	if !found {
		assert.False(t, idem.IsFinal(err), "nothing was recorded, but the error (%v) is final", err)
	}
}

// Two Stores over one Backend, a plain RunOnce in one and a RunOnceTx in
// the other, on one key, both ways round: fn runs once, and the second
// caller gets the first's result (or ErrInProgress, documented, for a
// RunOnceTx that meets a plain RunOnce in flight).
func TestPlainAndTxStoresOnOneKeyRunFnOnce(t *testing.T) {
	b, _ := openTemp(t, nil)
	require.NoError(t, b.Update(context.Background(), func(tx *bbolt.Tx) error {
		_, err := tx.CreateBucket(moves)
		return err
	}))
	plain := idem.New[int](idem.Options{Backend: b})
	defer plain.Close()
	txs := idem.New[int](idem.Options{Backend: b})
	defer txs.Close()
	var calls atomic.Int32
	txFn := func(ctx context.Context, tx *bbolt.Tx) (int, error) {
		calls.Add(1)
		return 7, tx.Bucket(moves).Put([]byte("k"), []byte("x"))
	}

	// RunOnceTx first, holding the committer; the plain RunOnce queues
	// behind it and replays its record.
	inside, release := make(chan struct{}), make(chan struct{})
	res := make(chan error, 1)
	go func() {
		_, err := RunOnceTx(context.Background(), txs, "a", "p", func(ctx context.Context, tx *bbolt.Tx) (int, error) {
			close(inside)
			<-release
			return txFn(ctx, tx)
		})
		res <- err
	}()
	<-inside
	got := make(chan int, 1)
	go func() {
		v, err := plain.RunOnce(context.Background(), "a", "p", func(context.Context) (int, error) { calls.Add(1); return -1, nil })
		assert.NoError(t, err)
		got <- v
	}()
	queued(t, b, 1)
	close(release)
	require.NoError(t, <-res)
	assert.Equal(t, 7, <-got)
	assert.Equal(t, int32(1), calls.Load())

	// The plain RunOnce first: RunOnceTx says ErrInProgress, then replays.
	calls.Store(0)
	inside2, release2 := make(chan struct{}), make(chan struct{})
	go func() {
		_, err := plain.RunOnce(context.Background(), "b", "p", func(context.Context) (int, error) {
			calls.Add(1)
			close(inside2)
			<-release2
			return 9, nil
		})
		res <- err
	}()
	<-inside2
	_, err := RunOnceTx(context.Background(), txs, "b", "p", txFn)
	assert.ErrorIs(t, err, idem.ErrInProgress)
	assert.ErrorIs(t, err, idem.ErrHeldOutsideTx, "the case tells apart from a wait that ended")
	close(release2)
	require.NoError(t, <-res)
	v, err := RunOnceTx(context.Background(), txs, "b", "p", txFn)
	require.NoError(t, err)
	assert.Equal(t, 9, v)
	assert.Equal(t, int32(1), calls.Load())
	rec, _, err := b.Get(context.Background(), "b", time.Now())
	require.NoError(t, err)
	assert.Equal(t, backend.StateCompleted, rec.State)
}

// One group commit of n RunOnceTx calls, every other one failing: a
// failure rolls the whole transaction back, and the ops before it commit
// in a transaction of their own, so a succeeding fn runs at most twice
// (it was once per failure after it: quadratic).
func TestGroupRetryRunsEachFnAtMostTwice(t *testing.T) {
	b, _ := openTemp(t, nil)
	require.NoError(t, b.Update(context.Background(), func(tx *bbolt.Tx) error {
		_, err := tx.CreateBucket(moves)
		return err
	}))
	s := idem.New[int](idem.Options{Backend: b})
	defer s.Close()
	release := holdCommitter(t, b)
	const n = 256
	var calls [n]atomic.Int32
	done := make(chan struct{}, n)
	for i := range n {
		go func() {
			defer func() { done <- struct{}{} }()
			_, _ = RunOnceTx(context.Background(), s, fmt.Sprintf("k%03d", i), i, func(ctx context.Context, tx *bbolt.Tx) (int, error) {
				calls[i].Add(1)
				if err := tx.Bucket(moves).Put(fmt.Appendf(nil, "k%03d", i), []byte("x")); err != nil {
					return 0, err
				}
				if i%2 == 1 {
					return 0, errors.New("fails")
				}
				return i, nil
			})
		}()
	}
	queued(t, b, n)
	release()
	for range n {
		<-done
	}
	total, most := 0, int32(0)
	for i := range n {
		total += int(calls[i].Load())
		most = max(most, calls[i].Load())
	}
	t.Logf("%d calls ran fn %d times in all, one fn up to %d times", n, total, most)
	assert.LessOrEqual(t, most, int32(2), "a succeeding fn runs at most once more because others in its group failed")
}

// A read-only Backend that was closed answers
// every call with ErrClosed, as Close's doc says, not "read-only" for the
// writes and ErrClosed for the reads.
func TestClosedReadOnlyBackendSaysClosed(t *testing.T) {
	b, path := openTemp(t, nil)
	require.NoError(t, b.Close())
	ro, err := Open(path, &Options{ReadOnly: true})
	require.NoError(t, err)
	require.NoError(t, ro.Close())
	ctx, now := context.Background(), time.Now()
	assert.ErrorIs(t, ro.Forget(ctx, "k", now), idem.ErrClosed)
	assert.ErrorIs(t, ro.Release(ctx, "k", "t"), idem.ErrClosed)
	_, err = ro.Sweep(ctx, now, 10)
	assert.ErrorIs(t, err, idem.ErrClosed)
	_, _, err = ro.Get(ctx, "k", now)
	assert.ErrorIs(t, err, idem.ErrClosed)
}
