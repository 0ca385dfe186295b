package postgres

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/seed094d4201/idem/internal/svctest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// waitLimit is the operator's limit the tests set: short, so that a
// duplicate meets it several times while it waits.
const waitLimit = 200 * time.Millisecond

// limitedPool is a pool whose sessions start with setting (statement_timeout
// or lock_timeout) at waitLimit, as an operator's ALTER ROLE ... SET or
// ALTER DATABASE ... SET gives every session of the application's role.
func limitedPool(t *testing.T, setting string) *pgxpool.Pool {
	t.Helper()
	testPool(t) // or skip
	cfg, err := pgxpool.ParseConfig(svctest.Postgres(t))
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams[setting] = waitLimit.String()
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	var got string
	require.NoError(t, pool.QueryRow(context.Background(), "SHOW "+setting).Scan(&got))
	require.Equal(t, "200ms", got)
	return pool
}

// newStore returns a Store over b, closed when the test ends, after any
// key holdKey holds is released.
func newStore(t *testing.T, b *Backend) *idem.Store[string] {
	s := idem.New[string](idem.Options{Backend: b})
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// cutShort sets testHookWaitedOut, for the test's length, to report each
// claim the server cut short on the channel it returns.
func cutShort(t *testing.T) <-chan struct{} {
	cut := make(chan struct{}, 1)
	testHookWaitedOut = func() {
		select {
		case cut <- struct{}{}:
		default:
		}
	}
	t.Cleanup(func() { testHookWaitedOut = nil })
	return cut
}

// holdKey runs a RunOnceTx of key on s whose fn waits until the returned
// release is called, and returns once fn runs: the key's row is written,
// not committed. release returns what the RunOnceTx returned.
func holdKey(t *testing.T, s *idem.Store[string], key string) (release func() (string, error)) {
	t.Helper()
	running, end := make(chan struct{}), make(chan struct{})
	type answer struct {
		v   string
		err error
	}
	done := make(chan answer, 1)
	go func() {
		v, err := RunOnceTx(context.Background(), s, key, nil, func(context.Context, pgx.Tx) (string, error) {
			close(running)
			<-end
			return "first", nil
		})
		done <- answer{v, err}
	}()
	select {
	case <-running:
	case a := <-done:
		t.Fatalf("the first RunOnceTx returned before its fn ran: %q, %v", a.v, a.err)
	}
	var once sync.Once
	var a answer
	release = func() (string, error) {
		once.Do(func() { close(end); a = <-done })
		return a.v, a.err
	}
	t.Cleanup(func() { _, _ = release() })
	return release
}

// A duplicate of a RunOnceTx whose transaction is still open waits for it
// to end, then replays its outcome, on a server whose statement_timeout
// cuts its wait short again and again (it failed after 0.5 s with
// "canceling statement due to statement timeout (SQLSTATE 57014)", its
// ctx alive, though RunOnceTx's doc says it blocks until the first
// transaction ends): for a new key, whose row the first transaction
// inserted, and for an expired one, whose row it took over.
func TestTxDuplicateOutlastsStatementTimeout(t *testing.T) {
	testDuplicateOutlasts(t, "statement_timeout", true)
}

// The same for a plain RunOnce in another process, on a server whose
// lock_timeout cuts the claim's wait on the row short (it failed with
// "canceling statement due to lock timeout (SQLSTATE 55P03)").
func TestDuplicateOutlastsLockTimeout(t *testing.T) {
	testDuplicateOutlasts(t, "lock_timeout", false)
}

func testDuplicateOutlasts(t *testing.T, setting string, tx bool) {
	pool := limitedPool(t, setting)
	for _, old := range []bool{false, true} {
		name := "new key"
		if old {
			name = "expired key"
		}
		t.Run(name, func(t *testing.T) {
			b, _ := testBackend(t, pool)
			if old {
				expired(t, b, "order-1")
			}
			first, second := newStore(t, b), newStore(t, b) // two processes
			cut := cutShort(t)
			release := holdKey(t, first, "order-1")

			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			var ran atomic.Bool
			fn := func(context.Context) (string, error) { ran.Store(true); return "second", nil }
			var got string
			dup := make(chan error, 1)
			go func() {
				var err error
				if tx {
					got, err = RunOnceTx(ctx, second, "order-1", nil, func(ctx context.Context, _ pgx.Tx) (string, error) { return fn(ctx) })
				} else {
					got, err = second.RunOnce(ctx, "order-1", nil, fn)
				}
				dup <- err
			}()
			for range 2 { // the limit passes twice: the duplicate waits on
				select {
				case <-cut:
				case err := <-dup:
					t.Fatalf("the duplicate returned while the first transaction was open, with 20 s left on its ctx: %q, %v", got, err)
				}
			}

			v, err := release()
			require.NoError(t, err)
			require.Equal(t, "first", v)
			require.NoError(t, <-dup, "the duplicate, once the first transaction committed")
			assert.Equal(t, "first", got, "the duplicate replays the first outcome")
			assert.False(t, ran.Load(), "the duplicate ran fn")
		})
	}
}

// A Forget of a key whose expired record a RunOnceTx is taking over, its
// transaction still open, is refused as in progress when the server cuts
// its wait short, not failed with the server's timeout (57014).
func TestForgetOfKeyInTxUnderStatementTimeout(t *testing.T) {
	b, _ := testBackend(t, limitedPool(t, "statement_timeout"))
	expired(t, b, "order-3")
	release := holdKey(t, newStore(t, b), "order-3")
	err := b.Forget(context.Background(), "order-3", time.Time{})
	assert.ErrorIs(t, err, idem.ErrInProgress)
	_, rerr := release()
	require.NoError(t, rerr)
	rec, ok, gerr := b.Get(context.Background(), "order-3", time.Time{})
	require.NoError(t, gerr)
	require.True(t, ok, "the refused Forget deleted the outcome")
	assert.Equal(t, `"first"`, string(rec.Value))
}

// expired leaves key with a completed record that has expired, which the
// next claim takes over.
func expired(t *testing.T, b *Backend, key string) {
	t.Helper()
	ctx := context.Background()
	rec, won, err := b.Claim(ctx, backend.Record{Key: key, Token: "old", State: backend.StatePending}, time.Time{}, time.Minute)
	require.NoError(t, err)
	require.True(t, won)
	rec.Value = []byte(`"old"`)
	require.NoError(t, b.Complete(ctx, rec, time.Time{}, time.Millisecond))
	require.Eventually(t, func() bool {
		_, ok, err := b.Get(ctx, key, time.Time{})
		return err == nil && !ok
	}, 10*time.Second, 5*time.Millisecond, "the record never expired")
}

// A claim that waits on an uncommitted row and whose own ctx ends returns
// then, with ctx's error: our own cancellation (also 57014) is not the
// server's limit, and is not waited out.
func TestClaimWaitingOnARowEndsWithItsCtx(t *testing.T) {
	pool := testPool(t)
	b, _ := testBackend(t, pool)
	s := newStore(t, b)
	release := holdKey(t, s, "order-4")
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, _, err := b.Claim(ctx, backend.Record{Key: "order-4", Token: "dup", State: backend.StatePending}, time.Time{}, time.Minute)
	require.Error(t, err)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Less(t, time.Since(start), 10*time.Second, "the claim outlived its ctx")
	_, rerr := release()
	require.NoError(t, rerr)
}

// The operator-settings conformance checks, under statement_timeout and
// under lock_timeout.
func TestOperatorSettings(t *testing.T) {
	for _, setting := range []string{"statement_timeout", "lock_timeout"} {
		t.Run(setting, func(t *testing.T) {
			idemtest.RunOperator(t, idemtest.Operator{
				WaitLimited: func(t *testing.T) backend.Backend {
					b, _ := testBackend(t, limitedPool(t, setting))
					return b
				},
				WaitLimit: waitLimit,
				RunOnceTx: func(ctx context.Context, s *idem.Store[string], key string, fn func(context.Context) (string, error)) (string, error) {
					return RunOnceTx(ctx, s, key, nil, func(ctx context.Context, _ pgx.Tx) (string, error) { return fn(ctx) })
				},
			})
		})
	}
}

// An outcome whose Complete waits on a row lock (an operator's SELECT ...
// FOR UPDATE of the key's row, left open) past the server's limit is cut
// short (57014 or 55P03) and sent again, as a write of unknown fate, until
// the lock ends, in the background once the store's SettleTimeout has
// passed: RunOnce answers the outcome, and it is recorded once the lock
// ends. The key is not left pending, nor the outcome lost.
func TestCompleteOutlastsAnOperatorsRowLock(t *testing.T) {
	for _, setting := range []string{"statement_timeout", "lock_timeout"} {
		t.Run(setting, func(t *testing.T) {
			b, table := testBackend(t, limitedPool(t, setting))
			operator := testPool(t)
			s := idem.New[string](idem.Options{Backend: b, SettleTimeout: time.Second})
			defer s.Close()
			ctx := context.Background()
			lock, err := operator.Begin(ctx)
			require.NoError(t, err)
			defer lock.Rollback(ctx)
			type answer struct {
				v   string
				err error
			}
			answered := make(chan answer, 1)
			go func() {
				v, err := s.RunOnce(ctx, "k", nil, func(context.Context) (string, error) {
					_, err := lock.Exec(ctx, "SELECT 1 FROM "+table+" WHERE key = 'k' FOR UPDATE")
					return "v", err
				})
				answered <- answer{v, err}
			}()
			// Until the Complete has been cut short and sent again: two
			// starts of it seen waiting on the lock.
			var starts []time.Time
			for len(starts) < 2 {
				var start time.Time
				err := operator.QueryRow(ctx, `SELECT query_start FROM pg_stat_activity
WHERE wait_event_type = 'Lock' AND query LIKE 'UPDATE %' AND query LIKE '%'||$1||'%SET state = 2%'`, table).Scan(&start)
				if err == nil && (len(starts) == 0 || !start.Equal(starts[len(starts)-1])) {
					starts = append(starts, start)
				}
			}
			require.NoError(t, lock.Rollback(ctx))
			a := <-answered
			require.NoError(t, a.err)
			assert.Equal(t, "v", a.v)
			require.Eventually(t, func() bool {
				rec, ok, err := b.Get(ctx, "k", time.Time{})
				return err == nil && ok && rec.State == backend.StateCompleted
			}, 10*time.Second, 10*time.Millisecond, "the outcome is recorded once the lock ends")
		})
	}
}
