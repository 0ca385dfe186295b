package sqlite

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/seed094d4201/idem/backend"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// On a *sql.DB of one connection (db.SetMaxOpenConns(1)), a read waits for
// that connection while a write holds it, and a write holds it for as long
// as another process keeps the write lock (the busy timeout, and again).
// Get and Claim must still end when their ctx does. Before, Get read with
// context.WithoutCancel(ctx), so a Get whose ctx had a 100 ms deadline
// waited for the other process's lock to go (here 5 s). A Claim that
// failed so had only read: it is refused (backend.ErrRefused), so that the
// Store need not read back a write that was never sent.
func TestReadWaitingForTheOnlyConnectionEndsWithItsCtx(t *testing.T) {
	path := filepath.Join(t.TempDir(), "idem.db")
	db, err := Open(path)
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	db.SetMaxOpenConns(1)
	ctx := context.Background()
	b, err := New(ctx, db, Options{})
	require.NoError(t, err)
	claim, won, err := b.Claim(ctx, backend.Record{Key: "k", Token: "t", State: backend.StatePending}, time.Now(), time.Minute)
	require.NoError(t, err)
	require.True(t, won)

	// Another process (another *sql.DB) holds the write lock.
	other, err := Open(path)
	require.NoError(t, err)
	t.Cleanup(func() { _ = other.Close() })
	lockTx, err := other.BeginTx(ctx, nil) // _txlock=immediate: takes the write lock
	require.NoError(t, err)
	_, err = lockTx.Exec(`CREATE TABLE IF NOT EXISTS other (x)`)
	require.NoError(t, err)
	released := make(chan struct{})
	release := func() {
		select {
		case <-released:
		default:
			close(released)
			_ = lockTx.Rollback()
		}
	}
	t.Cleanup(release)
	// A bound on the test, should the read never give up: not an ordering.
	timer := time.AfterFunc(5*time.Second, release)
	defer timer.Stop()

	// A write that waits for that lock on the only connection.
	renewed := make(chan error, 1)
	go func() { renewed <- b.Renew(ctx, "k", claim.Token, time.Now(), time.Minute) }()
	require.Eventually(t, func() bool { return db.Stats().InUse == 1 }, 5*time.Second, time.Millisecond, "the write holds the connection")

	for _, call := range []struct {
		name string
		do   func(ctx context.Context) error
	}{
		{"Get", func(ctx context.Context) error { _, _, err := b.Get(ctx, "k", time.Now()); return err }},
		{"Claim", func(ctx context.Context) error {
			_, _, err := b.Claim(ctx, backend.Record{Key: "k", Token: "t2", State: backend.StatePending}, time.Now(), time.Minute)
			return err
		}},
	} {
		cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		start := time.Now()
		err := call.do(cctx)
		took := time.Since(start)
		cancel()
		assert.ErrorIs(t, err, context.DeadlineExceeded, call.name)
		if call.name == "Claim" {
			assert.ErrorIs(t, err, backend.ErrRefused, "a Claim that only read wrote nothing: refused")
		}
		assert.Less(t, took, 2*time.Second, "%s ends with its ctx, not with another process's lock", call.name)
	}
	release()
	require.NoError(t, <-renewed)
}
