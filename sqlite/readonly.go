package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
)

// OpenReadOnly opens the existing database at path for reading only, as
// idem's CLI does for inspect and show. It never writes in the file, and
// beside it only the -shm that reading a log needs:
//
//   - With no -wal or -journal file beside it, no process has the database
//     open (the last connection to close removes its -wal), and it is
//     opened immutable: no locks, no -shm, nothing created, so it reads on
//     a read-only mount (a backup, a snapshot). A process that opens the
//     database for writing while it is read may change pages under the
//     reader, which then fails with "database disk image is malformed":
//     read it again (while that process runs, its -wal makes the next
//     open read-only, not immutable), or read a copy.
//   - With one, a process has the database open, or stopped without
//     closing it, and its last commits are in the log: SQLite reads it
//     through the -shm file, which it creates if it is missing. On a
//     read-only directory that cannot be done, and the error says so.
//
// The database is opened at once: an error names why it cannot be read,
// not the first table a caller reads.
func OpenReadOnly(ctx context.Context, path string) (*sql.DB, error) {
	if path == "" || path == ":memory:" {
		return nil, fmt.Errorf("sqlite: OpenReadOnly needs an existing file, not %q", path)
	}
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("sqlite: %w", err)
	}
	// SQLite follows a symlink and keeps its -wal beside the target.
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return nil, fmt.Errorf("sqlite: %w", err)
	}
	live := exists(real+"-wal") || exists(real+"-journal")
	q := url.Values{}
	q.Add("_pragma", fmt.Sprintf("busy_timeout(%d)", BusyTimeout.Milliseconds()))
	if live {
		q.Set("mode", "ro")
	} else {
		q.Set("immutable", "1")
	}
	db, err := sql.Open("sqlite", "file:"+uriPath.Replace(path)+"?"+q.Encode())
	if err != nil {
		return nil, fmt.Errorf("sqlite: opening %s read-only: %w", path, err)
	}
	var n int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_schema`).Scan(&n); err != nil {
		db.Close()
		if live {
			return nil, fmt.Errorf("sqlite: opening %s read-only: %w (a -wal or -journal file beside it says a process has it open or stopped without closing it; reading its log needs a -shm file beside it, which a read-only directory cannot hold: copy the database and its -wal to a writable directory)", path, closedErr(err))
		}
		return nil, fmt.Errorf("sqlite: opening %s read-only: %w", path, closedErr(err))
	}
	return db, nil
}

// exists reports whether something is at path.
func exists(path string) bool {
	_, err := os.Lstat(path)
	return !errors.Is(err, fs.ErrNotExist)
}
