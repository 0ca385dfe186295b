package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// movesStore returns a store over a new file with the caller's moves
// table, and a func counting its rows.
func movesStore(t *testing.T, opts idem.Options) (*idem.Store[int], *Backend, func() int) {
	t.Helper()
	b, _ := testBackend(t)
	_, err := b.db.Exec(stockTable)
	require.NoError(t, err)
	opts.Backend = b
	s := idem.New[int](opts)
	t.Cleanup(func() { s.Close() })
	return s, b, func() int {
		var n int
		require.NoError(t, b.db.QueryRow(`SELECT count(*) FROM moves`).Scan(&n))
		return n
	}
}

// returnsWithin reports whether done is closed before d passes.
func returnsWithin(done <-chan struct{}, d time.Duration) bool {
	select {
	case <-done:
		return true
	case <-time.After(d):
		return false
	}
}

// fn calls runtime.Goexit (as t.FailNow does inside it) while the caller's
// ctx can end but has not: the caller must not be left waiting for its ctx.
// With a ctx that can end, txrun.Do runs the work on a goroutine of its
// own, which the Goexit ends: the outcome is still sent, from a deferred
// call.
func TestGoexitInFnWithCancellableCtxAnswersTheCaller(t *testing.T) {
	s, _, rows := movesStore(t, idem.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	done := make(chan struct{})
	var err error
	go func() {
		defer close(done)
		_, err = RunOnceTx(ctx, s, "k", "p", func(ctx context.Context, tx *sql.Tx) (int, error) {
			runtime.Goexit()
			return 0, nil
		})
	}()
	if !returnsWithin(done, 5*time.Second) {
		cancel()
		<-done
		t.Fatalf("RunOnceTx whose fn called runtime.Goexit waited for the caller's ctx to end; it returned %v only then", err)
	}
	assert.Equal(t, 0, rows())
}

// A *sql.DB limited to one connection, as many SQLite programs set it
// (db.SetMaxOpenConns(1)): no statement is prepared on the pool while a
// transaction holds its only connection (New prepares them all).
func TestRunOnceTxWorksWithOneOpenConnection(t *testing.T) {
	for _, mode := range []string{"RunOnce", "RunOnceTx"} {
		t.Run(mode, func(t *testing.T) {
			db, _ := openTemp(t)
			db.SetMaxOpenConns(1)
			b, err := New(context.Background(), db, Options{})
			require.NoError(t, err)
			_, err = db.Exec(stockTable)
			require.NoError(t, err)
			// ExecutionTimeout bounds RunOnceTx's detached work, so that a
			// deadlock ends and the test can close the file.
			s := idem.New[int](idem.Options{Backend: b, ExecutionTimeout: 3 * time.Second})
			defer s.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			var v int
			if mode == "RunOnce" {
				v, err = s.RunOnce(ctx, "k", "p", func(context.Context) (int, error) { return 7, nil })
			} else {
				v, err = RunOnceTx(ctx, s, "k", "p", func(ctx context.Context, tx *sql.Tx) (int, error) {
					_, err := tx.ExecContext(ctx, `INSERT INTO moves (note) VALUES ('k')`)
					return 7, err
				})
			}
			require.NoError(t, err, "one connection is enough for SQLite's one writer")
			assert.Equal(t, 7, v)
		})
	}
}

// SQLite rolls the whole transaction back by itself on some errors: a
// trigger's RAISE(ROLLBACK), INSERT OR ROLLBACK, an interrupted statement,
// SQLITE_FULL. The connection is then in autocommit mode, so every later
// statement fn runs through tx would commit at once, without the key. fn
// here handles the rejection the way a stock service would (it notes the
// rejection and answers it): the commit guard turns those commits into
// rollbacks, so nothing lands and the key stays free.
func TestAutoRollbackInFnCommitsNothing(t *testing.T) {
	for _, final := range []bool{false, true} {
		t.Run(fmt.Sprintf("final=%v", final), func(t *testing.T) {
			s, b, rows := movesStore(t, idem.Options{})
			_, err := b.db.Exec(`CREATE TRIGGER no_bad BEFORE INSERT ON moves WHEN NEW.note = 'bad'
BEGIN SELECT RAISE(ROLLBACK, 'out of stock'); END`)
			require.NoError(t, err)
			var calls atomic.Int32
			fn := func(ctx context.Context, tx *sql.Tx) (int, error) {
				calls.Add(1)
				if _, err := tx.ExecContext(ctx, `INSERT INTO moves (note) VALUES ('bad')`); err == nil {
					return 0, errors.New("the trigger did not fire")
				}
				if _, err := tx.ExecContext(ctx, `INSERT INTO moves (note) VALUES ('rejected')`); err != nil {
					return 0, err // what the library could wish for
				}
				if final {
					return 0, idem.Final(errors.New("out of stock"))
				}
				return 1, nil
			}
			for range 3 {
				_, _ = RunOnceTx(context.Background(), s, "k", "p", fn)
			}
			rec, found, err := b.Get(context.Background(), "k", time.Now())
			require.NoError(t, err)
			if found {
				assert.Equal(t, 1, rows(), "the key is recorded: exactly its one write with it")
				assert.Equal(t, int32(1), calls.Load())
				t.Logf("key %s", rec.State)
			} else {
				assert.Equal(t, 0, rows(), "no key was recorded, yet %d notes were committed (fn ran %d times)", rows(), calls.Load())
			}
		})
	}
}

// A Store call from inside RunOnceTx's fn, with fn's ctx, would wait for
// the write semaphore that RunOnceTx holds until fn returns: it is refused
// (backend.ErrRefused), as bolt refuses it.
func TestNestedCallInsideRunOnceTxIsRefused(t *testing.T) {
	s, _, _ := movesStore(t, idem.Options{ExecutionTimeout: 2 * time.Second})
	var inner error
	start := time.Now()
	_, err := RunOnceTx(context.Background(), s, "outer", "p", func(ctx context.Context, tx *sql.Tx) (int, error) {
		_, inner = s.RunOnce(ctx, "inner", "p", func(context.Context) (int, error) { return 1, nil })
		return 1, nil
	})
	t.Logf("outer: %v; inner after %v: %v", err, time.Since(start).Round(time.Millisecond), inner)
	require.Error(t, inner)
	assert.ErrorIs(t, inner, backend.ErrRefused, "a call that can only deadlock is refused at once, not left to the timeout")
}

// New checks busy_timeout on one pooled connection. A busy timeout set by
// an Exec (per connection in SQLite) passes the check, and the pool's other
// connections have none: a write that meets another process's lock is
// tried again until the lock is free, not failed at once.
func TestBusyTimeoutSetOnOneConnectionStillWaits(t *testing.T) {
	path := filepath.Join(t.TempDir(), "idem.db")
	db, err := sql.Open("sqlite", "file:"+path)
	require.NoError(t, err)
	defer db.Close()
	ctx := context.Background()
	_, err = db.ExecContext(ctx, `PRAGMA busy_timeout = 10000`)
	require.NoError(t, err)
	b, err := New(ctx, db, Options{})
	if err != nil {
		t.Logf("New refused the database: %v", err)
		return // the right outcome
	}
	// Hold the connection that has the busy timeout, so that the backend
	// gets a new one.
	held, err := db.Conn(ctx)
	require.NoError(t, err)
	defer held.Close()

	// Another process (another *sql.DB) holds the write lock a moment.
	other, err := Open(path)
	require.NoError(t, err)
	defer other.Close()
	lockTx, err := other.BeginTx(ctx, nil) // _txlock=immediate: holds the write lock
	require.NoError(t, err)
	_, err = lockTx.Exec(`CREATE TABLE IF NOT EXISTS other (x)`)
	require.NoError(t, err)
	time.AfterFunc(300*time.Millisecond, func() { _ = lockTx.Rollback() }) // the scenario, not an ordering

	s := idem.New[int](idem.Options{Backend: b})
	defer s.Close()
	_, err = s.RunOnce(ctx, "k", "p", func(context.Context) (int, error) { return 1, nil })
	assert.NoError(t, err, "New accepted the database, so a 300 ms lock must be waited for")
}

// A result that the Codec cannot encode, with a final error ("card
// declined" and a NaN in the result): nothing is recorded and the next
// call runs fn again, so the caller's error must not say final.
func TestUnrecordedFinalErrorIsNotFinal(t *testing.T) {
	b, _ := testBackend(t)
	s := idem.New[float64](idem.Options{Backend: b})
	defer s.Close()
	var calls atomic.Int32
	fn := func(ctx context.Context, tx *sql.Tx) (float64, error) {
		calls.Add(1)
		return math.NaN(), idem.Final(errors.New("card declined"))
	}
	_, err := RunOnceTx(context.Background(), s, "k", "p", fn)
	_, found, gerr := b.Get(context.Background(), "k", time.Now())
	require.NoError(t, gerr)
	if !found {
		assert.False(t, idem.IsFinal(err), "nothing was recorded, but the error (%v) is final", err)
	}
}

// Table names that need quoting work end to end.
func TestQuotedTableNameWorks(t *testing.T) {
	db, _ := openTemp(t)
	for _, name := range []string{`we"ird`, `a b; DROP TABLE x; --`, `main.idem`} {
		b, err := New(context.Background(), db, Options{Table: name})
		require.NoError(t, err, name)
		s := idem.New[int](idem.Options{Backend: b})
		v, err := RunOnceTx(context.Background(), s, "k", "p", func(ctx context.Context, tx *sql.Tx) (int, error) { return 3, nil })
		require.NoError(t, err, name)
		assert.Equal(t, 3, v)
		v, err = s.RunOnce(context.Background(), "k", "p", func(context.Context) (int, error) { return 4, nil })
		require.NoError(t, err, name)
		assert.Equal(t, 3, v, "%s: replayed", name)
		require.NoError(t, s.Close())
		var n int
		require.NoError(t, db.QueryRow(`SELECT count(*) FROM `+quote(name)).Scan(&n))
		assert.Equal(t, 1, n, name)
	}
}

// Another process's RunOnceTx holds key "k", and with it the write lock,
// for longer than this process's busy timeout. RunOnceTx's doc says a
// duplicate in another process waits on the lock until the first
// transaction ends, and its caller until its ctx ends, then answers
// ErrInProgress (not a BackendError once the busy timeout passes, which an
// HTTP adapter would answer with 503 rather than 409).
func TestDuplicateInAnotherProcessPastBusyTimeoutIsInProgress(t *testing.T) {
	path := filepath.Join(t.TempDir(), "idem.db")
	child := startChild(t, "in-tx", crashFileEnv+"="+path)

	// This process opens the file with a short busy timeout in its DSN, as
	// New allows.
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(300)&_pragma=synchronous(FULL)&_txlock=immediate")
	require.NoError(t, err)
	defer db.Close()
	b, err := New(context.Background(), db, Options{NoMigrate: true})
	require.NoError(t, err)
	s := idem.New[int](idem.Options{Backend: b})
	defer s.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	start := time.Now()
	_, err = RunOnceTx(ctx, s, "k", "p", func(ctx context.Context, tx *sql.Tx) (int, error) {
		return 7, nil // runs once the other process's transaction is gone
	})
	t.Logf("after %v: %v", time.Since(start).Round(time.Millisecond), err)
	assert.ErrorIs(t, err, idem.ErrInProgress, "the key is in flight in another process")
	assert.ErrorIs(t, err, context.DeadlineExceeded, "and the caller waited as long as its ctx allowed")

	// The work waits on; once the other process is gone (its transaction
	// rolled back), it claims the key and runs, and a duplicate replays.
	sigkill(t, child)
	v, err := RunOnceTx(context.Background(), s, "k", "p", func(ctx context.Context, tx *sql.Tx) (int, error) {
		return 0, errors.New("ran twice")
	})
	require.NoError(t, err)
	assert.Equal(t, 7, v, "the waiting work ran fn once the key was free, and this call got its outcome")
}

// fn commits tx itself, which database/sql lets it do (and which RunOnceTx
// says it must not). The commit guard vetoes it; and were a claim ever
// committed without its outcome, its lapsed lease would make it
// interrupted, which Forget clears, never a claim in progress for ever.
func TestFnCommittingTxStrandsNothing(t *testing.T) {
	clock := idemtest.NewClock(time.Now().UTC().Truncate(time.Second))
	s, b, _ := movesStore(t, idem.Options{Now: clock.Now})
	ctx := context.Background()
	_, err := RunOnceTx(ctx, s, "k", "p", func(ctx context.Context, tx *sql.Tx) (int, error) {
		if _, err := tx.ExecContext(ctx, `INSERT INTO moves (note) VALUES ('k')`); err != nil {
			return 0, err
		}
		return 1, tx.Commit()
	})
	t.Logf("RunOnceTx: %v", err)
	clock.Advance(365 * 24 * time.Hour)
	rec, found, err := b.Get(ctx, "k", clock.Now())
	require.NoError(t, err)
	if found {
		t.Logf("a year later the key is %s", rec.State)
	}
	err = s.Forget(ctx, "k")
	assert.NoError(t, err, "an operator can clear a key its owner left unsettled")
}

// A process killed inside RunOnceTx while this process's RunOnceTx for the
// same key waits on the write lock: the waiter then claims the key itself
// and runs fn once.
func TestWaiterTakesOverAfterOwnerKilled(t *testing.T) {
	path := filepath.Join(t.TempDir(), "idem.db")
	child := startChild(t, "in-tx", crashFileEnv+"="+path)
	db, err := Open(path)
	require.NoError(t, err)
	defer db.Close()
	b, err := New(context.Background(), db, Options{NoMigrate: true})
	require.NoError(t, err)
	s := idem.New[int](idem.Options{Backend: b})
	defer s.Close()
	res := make(chan error, 1)
	var calls atomic.Int32
	go func() {
		_, err := RunOnceTx(context.Background(), s, "k", "p", func(ctx context.Context, tx *sql.Tx) (int, error) {
			calls.Add(1)
			_, err := tx.ExecContext(ctx, `INSERT INTO moves (note) VALUES ('k')`)
			return 1, err
		})
		res <- err
	}()
	sigkill(t, child)
	require.NoError(t, <-res)
	assert.Equal(t, int32(1), calls.Load())
	var n int
	require.NoError(t, db.QueryRow(`SELECT count(*) FROM moves`).Scan(&n))
	assert.Equal(t, 1, n, "the killed process's write is gone, this one's is there")
}

// A private in-memory database is refused by New: database/sql opens
// several connections and each would be a database of its own, the table
// on one of them only.
func TestPrivateMemoryDatabaseIsRefused(t *testing.T) {
	db, err := sql.Open("sqlite", "file::memory:?_pragma=busy_timeout(5000)")
	require.NoError(t, err)
	defer db.Close()
	b, err := New(context.Background(), db, Options{})
	if err != nil {
		t.Logf("refused: %v", err)
		return
	}
	s := idem.New[int](idem.Options{Backend: b})
	defer s.Close()
	var wg sync.WaitGroup
	errs := make([]error, 16)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = s.RunOnce(context.Background(), fmt.Sprint("k", i), "p", func(context.Context) (int, error) { return i, nil })
		}()
	}
	wg.Wait()
	for i, err := range errs {
		assert.NoError(t, err, "call %d", i)
	}
}

// The *sql.DB is closed while fn runs, and after: RunOnceTx either commits
// the key and fn's write together or neither, and a call on the closed DB
// is idem.ErrClosed.
func TestDBClosedAroundRunOnceTxIsAllOrNothing(t *testing.T) {
	db, path := openTemp(t)
	b, err := New(context.Background(), db, Options{})
	require.NoError(t, err)
	_, err = db.Exec(stockTable)
	require.NoError(t, err)
	s := idem.New[int](idem.Options{Backend: b})
	defer s.Close()
	_, err = RunOnceTx(context.Background(), s, "k", "p", func(ctx context.Context, tx *sql.Tx) (int, error) {
		if _, err := tx.ExecContext(ctx, `INSERT INTO moves (note) VALUES ('k')`); err != nil {
			return 0, err
		}
		require.NoError(t, db.Close())
		return 1, nil
	})
	t.Logf("closed during fn: %v", err)
	_, err = RunOnceTx(context.Background(), s, "k2", "p", func(ctx context.Context, tx *sql.Tx) (int, error) { return 1, nil })
	assert.ErrorIs(t, err, idem.ErrClosed)

	db2, err := Open(path)
	require.NoError(t, err)
	defer db2.Close()
	b2, err := New(context.Background(), db2, Options{})
	require.NoError(t, err)
	_, found, err := b2.Get(context.Background(), "k", time.Now())
	require.NoError(t, err)
	var n int
	require.NoError(t, db2.QueryRow(`SELECT count(*) FROM moves`).Scan(&n))
	assert.Equal(t, found, n == 1, "key %v, rows %d: both or neither", found, n)
}
