package postgres

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/seed094d4201/idem"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// RunOnceTx (BeginLocal) and plain RunOnce on one key, in one store and
// across two stores sharing the table: fn must run once, and everyone gets
// its outcome.
func TestTicketTxAndPlainRunOnceSameKey(t *testing.T) {
	pool := testPool(t)
	b, _ := testBackend(t, pool)
	s1 := idem.New[int](idem.Options{Backend: b})
	s2 := idem.New[int](idem.Options{Backend: b})
	t.Cleanup(func() { s1.Close(); s2.Close() })
	ctx := context.Background()

	t.Run("tx first", func(t *testing.T) {
		var runs atomic.Int32
		gate := make(chan struct{})
		started := make(chan struct{})
		txDone := make(chan error, 1)
		go func() {
			_, err := RunOnceTx(ctx, s1, "a", "p", func(ctx context.Context, tx pgx.Tx) (int, error) {
				runs.Add(1)
				close(started)
				<-gate
				return 11, nil
			})
			txDone <- err
		}()
		<-started
		plain := func(s *idem.Store[int]) <-chan error {
			ch := make(chan error, 1)
			go func() {
				c, cancel := context.WithTimeout(ctx, 10*time.Second)
				defer cancel()
				v, err := s.RunOnce(c, "a", "p", func(context.Context) (int, error) { runs.Add(1); return 99, nil })
				if err == nil && v != 11 {
					err = errors.New("wrong value")
				}
				ch <- err
			}()
			return ch
		}
		same, other := plain(s1), plain(s2)
		time.Sleep(100 * time.Millisecond)
		close(gate)
		require.NoError(t, <-txDone)
		assert.NoError(t, <-same, "plain RunOnce in the same store")
		assert.NoError(t, <-other, "plain RunOnce in another store")
		assert.EqualValues(t, 1, runs.Load())
	})

	t.Run("plain first", func(t *testing.T) {
		var runs atomic.Int32
		gate := make(chan struct{})
		started := make(chan struct{})
		plainDone := make(chan error, 1)
		go func() {
			_, err := s1.RunOnce(ctx, "b", "p", func(context.Context) (int, error) {
				runs.Add(1)
				close(started)
				<-gate
				return 22, nil
			})
			plainDone <- err
		}()
		<-started
		txSame := make(chan error, 1)
		go func() {
			v, err := RunOnceTx(ctx, s1, "b", "p", func(ctx context.Context, tx pgx.Tx) (int, error) { runs.Add(1); return 98, nil })
			if err == nil && v != 22 {
				err = errors.New("wrong value")
			}
			txSame <- err
		}()
		_, errOther := RunOnceTx(ctx, s2, "b", "p", func(ctx context.Context, tx pgx.Tx) (int, error) { runs.Add(1); return 97, nil })
		assert.ErrorIs(t, errOther, idem.ErrInProgress, "another store sees the plain claim")
		assert.ErrorIs(t, errOther, idem.ErrHeldOutsideTx)
		close(gate)
		require.NoError(t, <-plainDone)
		assert.NoError(t, <-txSame)
		assert.EqualValues(t, 1, runs.Load())
	})

	t.Run("panic in tx fn", func(t *testing.T) {
		_, err := RunOnceTx(ctx, s1, "c", "p", func(ctx context.Context, tx pgx.Tx) (int, error) { panic("boom") })
		var pe *idem.PanicError
		require.ErrorAs(t, err, &pe)
		v, err := RunOnceTx(ctx, s1, "c", "p", func(ctx context.Context, tx pgx.Tx) (int, error) { return 5, nil })
		require.NoError(t, err)
		assert.Equal(t, 5, v)
	})

	t.Run("caller leaves mid fn", func(t *testing.T) {
		c, cancel := context.WithCancel(ctx)
		gate := make(chan struct{})
		started := make(chan struct{})
		first := make(chan error, 1)
		go func() {
			_, err := RunOnceTx(c, s1, "d", "p", func(ctx context.Context, tx pgx.Tx) (int, error) {
				close(started)
				<-gate
				_, err := tx.Exec(ctx, "SELECT 1")
				return 4, err
			})
			first <- err
		}()
		<-started
		waiter := make(chan error, 1)
		go func() {
			v, err := RunOnceTx(ctx, s1, "d", "p", func(ctx context.Context, tx pgx.Tx) (int, error) { return 0, errors.New("ran twice") })
			if err == nil && v != 4 {
				err = errors.New("wrong value")
			}
			waiter <- err
		}()
		cancel()
		err := <-first // while fn is still blocked: the caller leaves on its own ctx
		assert.ErrorIs(t, err, idem.ErrInProgress)
		assert.ErrorIs(t, err, context.Canceled)
		close(gate)
		assert.NoError(t, <-waiter, "fn ran on, detached, and the waiter got its outcome")
	})
}
