package bolt

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	bbolt "go.etcd.io/bbolt"
)

// queued waits until n requests wait for the committer.
func queued(t *testing.T, b *Backend, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); len(b.reqs) < n; {
		require.True(t, time.Now().Before(deadline), "%d requests queued, want %d", len(b.reqs), n)
		time.Sleep(time.Millisecond) // polls a condition; it orders nothing
	}
}

// holdCommitter blocks the committer inside an Update until the returned
// func is called, so that the requests sent meanwhile share its next
// transaction.
func holdCommitter(t *testing.T, b *Backend) (release func()) {
	t.Helper()
	inside, gate, done := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	var once sync.Once
	go func() {
		done <- b.Update(context.Background(), func(*bbolt.Tx) error {
			once.Do(func() { close(inside) }) // it runs again if a request of its group rolls back
			<-gate
			return nil
		})
	}()
	<-inside
	return func() {
		close(gate)
		require.NoError(t, <-done)
	}
}

// RunOnceTx calls that share one group commit: the ones whose fn fails are
// rolled back alone; the others commit once, each with its key, though
// their fn may run again in the retried transaction.
func TestRunOnceTxFailureInAGroupCommit(t *testing.T) {
	b, _ := openTemp(t, nil)
	require.NoError(t, b.Update(context.Background(), func(tx *bbolt.Tx) error {
		_, err := tx.CreateBucket(moves)
		return err
	}))
	s := idem.New[int](idem.Options{Backend: b})
	defer s.Close()

	release := holdCommitter(t, b)
	const n = 12
	var calls [n]atomic.Int32
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = RunOnceTx(context.Background(), s, fmt.Sprintf("k%02d", i), i, func(ctx context.Context, tx *bbolt.Tx) (int, error) {
				calls[i].Add(1)
				if err := tx.Bucket(moves).Put(fmt.Appendf(nil, "k%02d", i), []byte("x")); err != nil {
					return 0, err
				}
				if i%3 == 1 {
					return 0, errors.New("fails after writing")
				}
				return i, nil
			})
		}()
	}
	queued(t, b, n)
	release()
	wg.Wait()

	reruns := 0
	for i := range n {
		key := fmt.Sprintf("k%02d", i)
		rec, found, err := b.Get(context.Background(), key, time.Now())
		require.NoError(t, err)
		if i%3 == 1 {
			assert.Error(t, errs[i])
			assert.False(t, found, "%s: a failed fn leaves no key", key)
			assert.Equal(t, int32(1), calls[i].Load(), "%s: a failed fn runs once", key)
		} else {
			require.NoError(t, errs[i])
			assert.True(t, found, "%s: committed with its key", key)
			assert.Equal(t, "completed", rec.State.String())
			assert.LessOrEqual(t, calls[i].Load(), int32(2), "%s: an fn runs at most twice for the failures of others", key)
			reruns += int(calls[i].Load()) - 1
		}
		require.NoError(t, b.View(context.Background(), func(tx *bbolt.Tx) error {
			assert.Equal(t, i%3 != 1, tx.Bucket(moves).Get([]byte(key)) != nil, "%s: its write is there exactly when its key is", key)
			return nil
		}))
	}
	t.Logf("%d fn calls ran again after another fn of their group failed", reruns)
}

func TestUpdate(t *testing.T) {
	b, _ := openTemp(t, nil)
	ctx := context.Background()
	require.NoError(t, b.Update(ctx, func(tx *bbolt.Tx) error {
		bk, err := tx.CreateBucket(moves)
		if err != nil {
			return err
		}
		return bk.Put([]byte("a"), []byte("1"))
	}))

	t.Run("an error rolls back", func(t *testing.T) {
		boom := errors.New("boom")
		err := b.Update(ctx, func(tx *bbolt.Tx) error {
			require.NoError(t, tx.Bucket(moves).Put([]byte("b"), []byte("2")))
			return boom
		})
		assert.ErrorIs(t, err, boom)
		assertNoKey(t, b, "b")
	})

	t.Run("a panic rolls back and goes on", func(t *testing.T) {
		assert.PanicsWithValue(t, "bug", func() {
			_ = b.Update(ctx, func(tx *bbolt.Tx) error {
				_ = tx.Bucket(moves).Put([]byte("c"), []byte("3"))
				panic("bug")
			})
		})
		assertNoKey(t, b, "c")
		require.NoError(t, b.Update(ctx, func(*bbolt.Tx) error { return nil }), "the committer is still there")
	})

	t.Run("idem's buckets are kept", func(t *testing.T) {
		err := b.Update(ctx, func(tx *bbolt.Tx) error { return tx.DeleteBucket(bucketRecords) })
		assert.ErrorContains(t, err, "deleted one of idem's buckets")
		require.NoError(t, b.View(ctx, func(tx *bbolt.Tx) error {
			assert.NotNil(t, tx.Bucket(bucketRecords))
			return nil
		}))
	})

	t.Run("a call from inside is refused, not a deadlock", func(t *testing.T) {
		s := idem.New[int](idem.Options{Backend: b})
		defer s.Close()
		var inner error
		_, err := RunOnceTx(ctx, s, "outer", "p", func(ctx context.Context, tx *bbolt.Tx) (int, error) {
			_, inner = s.RunOnce(ctx, "inner", "p", func(context.Context) (int, error) { return 1, nil })
			if inner == nil {
				inner = b.Update(ctx, func(*bbolt.Tx) error { return nil })
			}
			return 1, nil
		})
		require.NoError(t, err)
		assert.ErrorIs(t, inner, errNested)
		_, err = RunOnceTx(ctx, s, "outer2", "p", func(ctx context.Context, tx *bbolt.Tx) (int, error) {
			return RunOnceTx(ctx, s, "inner2", "p", func(context.Context, *bbolt.Tx) (int, error) { return 1, nil })
		})
		assert.ErrorIs(t, err, errNested)
	})

	t.Run("bad input", func(t *testing.T) {
		assert.Error(t, b.Update(ctx, nil))
		assert.Error(t, b.View(ctx, nil))
		cancelled, cancel := context.WithCancel(ctx)
		cancel()
		assert.ErrorIs(t, b.Update(cancelled, func(*bbolt.Tx) error { return nil }), context.Canceled)
	})

	t.Run("closed", func(t *testing.T) {
		b, _ := openTemp(t, nil)
		require.NoError(t, b.Close())
		assert.ErrorIs(t, b.Update(ctx, func(*bbolt.Tx) error { return nil }), idem.ErrClosed)
		assert.ErrorIs(t, b.View(ctx, func(*bbolt.Tx) error { return nil }), idem.ErrClosed)
	})
}

func assertNoKey(t *testing.T, b *Backend, key string) {
	t.Helper()
	require.NoError(t, b.View(context.Background(), func(tx *bbolt.Tx) error {
		assert.Nil(t, tx.Bucket(moves).Get([]byte(key)), "the write of %q was rolled back", key)
		return nil
	}))
}
