package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed094d4201/idem/backend"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// countCommits makes db a pool of one connection and counts the
// transactions that commit on it.
func countCommits(t *testing.T, db *sql.DB) *atomic.Int64 {
	t.Helper()
	db.SetMaxOpenConns(1)
	conn, err := db.Conn(context.Background())
	require.NoError(t, err)
	defer conn.Close()
	var n atomic.Int64
	require.NoError(t, conn.Raw(func(dc any) error {
		dc.(hooker).RegisterCommitHook(func() int32 { n.Add(1); return 0 })
		return nil
	}))
	return &n
}

// holdWrites takes b's write turn, as a RunOnceTx would, so that writes
// queue; the returned func gives it back.
func holdWrites(b *Backend) func() {
	b.write <- struct{}{}
	return func() { <-b.write }
}

// waitQueued waits until n requests wait in b's queue: a condition, not
// a time, so it yields to the goroutines that queue them.
func waitQueued(t *testing.T, b *Backend, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); runtime.Gosched() {
		if b.waiting() == n {
			return
		}
	}
	t.Fatalf("%d requests queued, not %d", b.waiting(), n)
}

// waiting counts the requests queued and not withdrawn.
func (b *Backend) waiting() int {
	b.qmu.Lock()
	defer b.qmu.Unlock()
	n := 0
	for _, r := range b.queue {
		if r.turn.Load() == queued {
			n++
		}
	}
	return n
}

func newClaim(key string) backend.Record {
	return backend.Record{Key: key, Token: "t-" + key, State: backend.StatePending}
}

// Claims that queue while one transaction holds the lock share the next
// commit: one fsync for all of them, where each paid its own.
func TestQueuedWritesShareOneCommit(t *testing.T) {
	db, _ := openTemp(t)
	b, err := New(context.Background(), db, Options{})
	require.NoError(t, err)
	commits := countCommits(t, db)

	const n = 50
	release := holdWrites(b)
	now := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, n)
	won := make([]bool, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, won[i], errs[i] = b.Claim(context.Background(), newClaim(fmt.Sprint("k", i)), now, time.Minute)
		}()
	}
	waitQueued(t, b, n)
	before := commits.Load()
	release()
	wg.Wait()
	for i := range n {
		require.NoError(t, errs[i])
		assert.True(t, won[i], "claim %d", i)
	}
	assert.Equal(t, int64(1), commits.Load()-before, "commits for %d queued claims", n)
	for i := range n {
		rec, ok, err := b.Get(context.Background(), fmt.Sprint("k", i), now)
		require.NoError(t, err)
		require.True(t, ok)
		assert.Equal(t, "t-k"+fmt.Sprint(i), rec.Token)
	}
}

// An op that fails in a shared transaction takes back nothing but its own
// writes: the writes queued with it commit, and it gets its error.
func TestFailedWriteSparesItsBatch(t *testing.T) {
	b, _ := testBackend(t)
	ctx := context.Background()
	_, err := b.db.ExecContext(ctx, `CREATE TABLE side (x INTEGER)`)
	require.NoError(t, err)
	commits := countCommits(t, b.db)

	release := holdWrites(b)
	now := time.Now()
	var wg sync.WaitGroup
	claim := func(key string) {
		defer wg.Done()
		_, won, err := b.Claim(ctx, newClaim(key), now, time.Minute)
		assert.NoError(t, err, key)
		assert.True(t, won, key)
	}
	wg.Add(1)
	go claim("before")
	waitQueued(t, b, 1)
	boom := errors.New("boom")
	failed := make(chan error, 1)
	go func() {
		failed <- b.do(ctx, func(ctx context.Context, tx *sql.Tx) error {
			if _, err := tx.ExecContext(ctx, `INSERT INTO side VALUES (1)`); err != nil {
				return err
			}
			return boom // after a write: the write must not stay
		})
	}()
	waitQueued(t, b, 2)
	wg.Add(1)
	go claim("after")
	waitQueued(t, b, 3)
	release()
	wg.Wait()
	assert.ErrorIs(t, <-failed, boom)

	var side int
	require.NoError(t, b.db.QueryRowContext(ctx, `SELECT count(*) FROM side`).Scan(&side))
	assert.Zero(t, side, "the failed op's write was committed")
	for _, key := range []string{"before", "after"} {
		_, ok, err := b.Get(ctx, key, now)
		require.NoError(t, err)
		assert.True(t, ok, key)
	}
	assert.LessOrEqual(t, commits.Load(), int64(2), "the claims were not committed together after the failure")
}

// A caller that leaves while its write is queued is refused, and nothing
// of its write happens.
func TestWithdrawnWriteWritesNothing(t *testing.T) {
	b, _ := testBackend(t)
	release := holdWrites(b)
	ctx, cancel := context.WithCancel(context.Background())
	now := time.Now()
	got := make(chan error, 1)
	go func() {
		_, _, err := b.Claim(ctx, newClaim("gone"), now, time.Minute)
		got <- err
	}()
	waitQueued(t, b, 1)
	cancel()
	err := <-got
	assert.ErrorIs(t, err, backend.ErrRefused)
	assert.ErrorIs(t, err, context.Canceled)
	release()

	// The next write finds the queue as it should: the withdrawn request
	// skipped, the committer running again.
	_, won, err := b.Claim(context.Background(), newClaim("next"), now, time.Minute)
	require.NoError(t, err)
	assert.True(t, won)
	_, ok, err := b.Get(context.Background(), "gone", now)
	require.NoError(t, err)
	assert.False(t, ok, "a withdrawn claim was written")
}

// A caller's ctx that ends once its write is in a transaction does not
// interrupt it: SQLite would roll back the whole transaction, the writes of
// every other caller in it too. The caller waits for the commit.
func TestEndedCtxInterruptsNoSharedTransaction(t *testing.T) {
	b, _ := testBackend(t)
	ctx := context.Background()
	_, err := b.db.ExecContext(ctx, `CREATE TABLE side (x INTEGER)`)
	require.NoError(t, err)
	release := holdWrites(b)
	now := time.Now()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, won, err := b.Claim(ctx, newClaim("other"), now, time.Minute)
		assert.NoError(t, err)
		assert.True(t, won)
	}()
	waitQueued(t, b, 1)
	leaving, leave := context.WithCancel(ctx)
	got := make(chan error, 1)
	go func() {
		got <- b.do(leaving, func(ctx context.Context, tx *sql.Tx) error {
			leave() // the caller leaves while its op runs
			_, err := tx.ExecContext(ctx, `INSERT INTO side VALUES (1)`)
			return err
		})
	}()
	waitQueued(t, b, 2)
	release()
	wg.Wait()
	require.NoError(t, <-got)
	var side int
	require.NoError(t, b.db.QueryRowContext(ctx, `SELECT count(*) FROM side`).Scan(&side))
	assert.Equal(t, 1, side)
	_, ok, err := b.Get(ctx, "other", now)
	require.NoError(t, err)
	assert.True(t, ok)
}

// A caller whose write waits for another connection's (another process's)
// write lock leaves when its ctx ends, refused and having written nothing,
// and the next write goes through once the lock is free.
func TestWriteLeavesWhileTheLockIsElsewhere(t *testing.T) {
	b, path := testBackend(t)
	other, err := Open(path)
	require.NoError(t, err)
	defer other.Close()
	ctx := context.Background()
	hold, err := other.BeginTx(ctx, nil) // BEGIN IMMEDIATE: the write lock
	require.NoError(t, err)
	_, err = hold.ExecContext(ctx, `CREATE TABLE held (x INTEGER)`)
	require.NoError(t, err)

	now := time.Now()
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, _, err = b.Claim(short, newClaim("waits"), now, time.Minute)
	assert.ErrorIs(t, err, backend.ErrRefused)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Less(t, time.Since(start), BusyTimeout/2, "the caller waited out the busy timeout")

	require.NoError(t, hold.Rollback())
	_, won, err := b.Claim(ctx, newClaim("next"), now, time.Minute)
	require.NoError(t, err)
	assert.True(t, won)
	_, ok, err := b.Get(ctx, "waits", now)
	require.NoError(t, err)
	assert.False(t, ok, "the claim that left was written")
}

// On a database opened without _txlock=immediate the first write of a
// transaction takes the lock, and may find it busy; the write is put back
// and tried again. A caller that left meanwhile is refused then, not held
// until the other connection lets go (it waited for as long as that).
func TestBusyRetryLetsTheCallerLeave(t *testing.T) {
	path := filepath.Join(t.TempDir(), "idem.db")
	seed, err := Open(path)
	require.NoError(t, err)
	require.NoError(t, seed.Close())
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(100)")
	require.NoError(t, err)
	defer db.Close()
	ctx := context.Background()
	b, err := New(ctx, db, Options{})
	require.NoError(t, err)
	other, err := Open(path)
	require.NoError(t, err)
	defer other.Close()
	hold, err := other.BeginTx(ctx, nil)
	require.NoError(t, err)
	_, err = hold.ExecContext(ctx, `CREATE TABLE held (x INTEGER)`)
	require.NoError(t, err)
	let := time.AfterFunc(10*time.Second, func() { _ = hold.Rollback() }) // should the test fail: no hang
	defer let.Stop()

	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, _, err = b.Claim(short, newClaim("k"), time.Now(), time.Minute)
	assert.ErrorIs(t, err, backend.ErrRefused)
	assert.Less(t, time.Since(start), 5*time.Second, "the caller was held past its ctx")
	require.NoError(t, hold.Rollback())
	_, ok, err := b.Get(ctx, "k", time.Now())
	require.NoError(t, err)
	assert.False(t, ok, "the refused claim was written")
}

// A write taken into a transaction that another write's failure rolls
// back is put back in the queue; if its caller left meanwhile, it is
// refused there, with nothing written, rather than run for no one.
func TestRolledBackWriteOfACallerWhoLeftIsRefused(t *testing.T) {
	b, _ := testBackend(t)
	ctx := context.Background()
	release := holdWrites(b)
	leaving, leave := context.WithCancel(ctx)
	got := make(chan error, 1)
	go func() {
		_, _, err := b.Claim(leaving, newClaim("B"), time.Now(), time.Minute)
		got <- err
	}()
	waitQueued(t, b, 1)
	failed := make(chan error, 1)
	go func() {
		failed <- b.do(ctx, func(context.Context, *sql.Tx) error {
			leave() // B is in this transaction already: it cannot withdraw
			return errors.New("boom")
		})
	}()
	waitQueued(t, b, 2)
	release()
	require.Error(t, <-failed)
	err := <-got
	assert.ErrorIs(t, err, backend.ErrRefused)
	assert.ErrorIs(t, err, context.Canceled)
	_, ok, err := b.Get(ctx, "B", time.Now())
	require.NoError(t, err)
	assert.False(t, ok, "the refused claim was written")
}

// A check SQLite defers to COMMIT (a deferred foreign key in the caller's
// schema) fails only the write that broke it: the writes that shared its
// transaction are run again, one a transaction.
func TestCommitFailureFailsOnlyTheGuiltyWrite(t *testing.T) {
	b, _ := testBackend(t)
	ctx := context.Background()
	_, err := b.db.ExecContext(ctx, `CREATE TABLE charges (k TEXT REFERENCES idem_keys(key) DEFERRABLE INITIALLY DEFERRED)`)
	require.NoError(t, err)
	now := time.Now()
	ref := newClaim("ref")
	_, won, err := b.Claim(ctx, ref, now, time.Minute)
	require.NoError(t, err)
	require.True(t, won)
	ref.State = backend.StateCompleted
	require.NoError(t, b.Complete(ctx, ref, now, time.Hour))
	_, err = b.db.ExecContext(ctx, `INSERT INTO charges VALUES ('ref')`)
	require.NoError(t, err)

	release := holdWrites(b)
	var wg sync.WaitGroup
	errs := make([]error, 10)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _, errs[i] = b.Claim(ctx, newClaim(fmt.Sprint("innocent", i)), now, time.Minute)
		}()
	}
	waitQueued(t, b, 10)
	forgot := make(chan error, 1)
	go func() { forgot <- b.Forget(ctx, "ref", now) }()
	waitQueued(t, b, 11)
	release()
	wg.Wait()
	assert.Error(t, <-forgot, "the Forget that broke the foreign key")
	for i, err := range errs {
		assert.NoError(t, err, "innocent claim %d", i)
	}
	_, ok, err := b.Get(ctx, "ref", now)
	require.NoError(t, err)
	assert.True(t, ok, "the referenced record was deleted")
	_, won, err = b.Claim(ctx, newClaim("after"), now, time.Minute)
	require.NoError(t, err, "the connection is usable after a failed commit")
	assert.True(t, won)
}

// Callers who leave while the write turn is held long leave nothing
// queued behind them (each kept its op and its value until the committer
// ran again).
func TestWithdrawnWritesLeaveTheQueue(t *testing.T) {
	b, _ := testBackend(t)
	release := holdWrites(b)
	defer release()
	for i := range 50 {
		ctx, cancel := context.WithCancel(context.Background())
		got := make(chan error, 1)
		go func() {
			got <- b.Complete(ctx, backend.Record{Key: fmt.Sprint("k", i), Token: "t", Value: make([]byte, 4096)}, time.Now(), time.Hour)
		}()
		waitQueued(t, b, 1)
		cancel()
		require.ErrorIs(t, <-got, backend.ErrRefused)
	}
	b.qmu.Lock()
	n := len(b.queue)
	b.qmu.Unlock()
	assert.Zero(t, n, "requests left queued")
}
