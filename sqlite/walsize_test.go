package sqlite

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A reader held open under steady writes grows the -wal (no checkpoint can
// pass it); once it closes, the next checkpoint truncates the file back to
// journal_size_limit, where SQLite's default (-1) kept it at its largest.
func TestWALShrinksAfterALongReader(t *testing.T) {
	defer func(old int) { journalSizeLimit = old }(journalSizeLimit)
	journalSizeLimit = 256 << 10
	path := filepath.Join(t.TempDir(), "wal.db")
	db, err := Open(path)
	require.NoError(t, err)
	defer db.Close()
	ctx := context.Background()
	_, err = db.ExecContext(ctx, `CREATE TABLE blobs (b BLOB)`)
	require.NoError(t, err)

	// Another process's reader: a deferred transaction (Open's take the
	// write lock as they begin).
	reader, err := sql.Open("sqlite", "file:"+path+"?mode=ro")
	require.NoError(t, err)
	defer reader.Close()
	rtx, err := reader.BeginTx(ctx, nil)
	require.NoError(t, err)
	var n int
	require.NoError(t, rtx.QueryRowContext(ctx, `SELECT count(*) FROM blobs`).Scan(&n)) // holds its snapshot
	blob := []byte(strings.Repeat("x", 64<<10))
	for range 64 { // 4 MiB, none of it checkpointable past the reader
		_, err = db.ExecContext(ctx, `INSERT INTO blobs VALUES (?)`, blob)
		require.NoError(t, err)
	}
	grown := walSize(t, path)
	require.Greater(t, grown, int64(2<<20), "the reader held the log")
	require.NoError(t, rtx.Rollback())
	require.NoError(t, reader.Close())

	_, err = db.ExecContext(ctx, `PRAGMA wal_checkpoint(PASSIVE)`)
	require.NoError(t, err)
	_, err = db.ExecContext(ctx, `INSERT INTO blobs VALUES (?)`, blob) // restarts the log from its start
	require.NoError(t, err)
	_, err = db.ExecContext(ctx, `PRAGMA wal_checkpoint(PASSIVE)`)
	require.NoError(t, err)
	after := walSize(t, path)
	t.Logf("-wal %d bytes with the reader open, %d after", grown, after)
	assert.LessOrEqual(t, after, int64(journalSizeLimit), "the log stays at its largest")
}

func walSize(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path + "-wal")
	require.NoError(t, err)
	return fi.Size()
}
