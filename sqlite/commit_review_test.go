package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/seed094d4201/idem/backend"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Regression tests from the hostile review of the committer.

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
