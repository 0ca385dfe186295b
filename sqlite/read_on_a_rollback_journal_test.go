package sqlite

import (
	"context"
	"database/sql"
	"net/url"
	"path/filepath"
	"testing"
	"time"

	"github.com/seed094d4201/idem/backend"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A database New did not put in WAL mode (Options.NoMigrate, over a file
// whose schema a team's own tool made, in SQLite's default rollback
// journal) has readers wait for a writer's lock in the busy handler. Get
// and Claim must still end when their ctx does. Before, Get read with
// context.WithoutCancel(ctx) on any unbounded pool, on the ground that a
// read never waits in WAL mode, so a Get or a Claim whose ctx had a 100 ms
// deadline waited for the busy timeout (here 3 s) while another process
// held the lock.
func TestReadOnARollbackJournalEndsWithItsCtx(t *testing.T) {
	path := filepath.Join(t.TempDir(), "idem.db")
	dsn := func() string {
		q := url.Values{}
		q.Add("_pragma", "busy_timeout(3000)")
		q.Set("_txlock", "immediate")
		return "file:" + path + "?" + q.Encode()
	}
	db, err := sql.Open("sqlite", dsn())
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	ctx := context.Background()
	_, err = db.ExecContext(ctx, Schema)
	require.NoError(t, err)
	var mode string
	require.NoError(t, db.QueryRowContext(ctx, `PRAGMA journal_mode`).Scan(&mode))
	require.Equal(t, "delete", mode, "the file is in SQLite's default rollback journal")
	b, err := New(ctx, db, Options{NoMigrate: true})
	require.NoError(t, err)
	_, won, err := b.Claim(ctx, backend.Record{Key: "k", Token: "t", State: backend.StatePending}, time.Now(), time.Minute)
	require.NoError(t, err)
	require.True(t, won)

	// Another process (another *sql.DB) holds an exclusive lock, which
	// keeps readers out of a rollback-journal database.
	other, err := sql.Open("sqlite", dsn())
	require.NoError(t, err)
	t.Cleanup(func() { _ = other.Close() })
	conn, err := other.Conn(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	_, err = conn.ExecContext(ctx, `BEGIN EXCLUSIVE`)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = conn.ExecContext(ctx, `ROLLBACK`) })

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
}
