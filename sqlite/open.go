package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"strings"
	"time"

	_ "modernc.org/sqlite" // registers the "sqlite" driver: pure Go, no cgo
)

// BusyTimeout is how long Open's connections wait for another connection's
// write lock (another process's, or a long RunOnceTx) before a statement
// fails with SQLITE_BUSY.
const BusyTimeout = 10 * time.Second

// Open opens, or creates, the SQLite database at path with the pure-Go
// driver modernc.org/sqlite, set up as a Backend needs it. The file is
// put in WAL mode, which it keeps: readers never block the writer nor each
// other, and a commit is one append to the log. Every connection gets:
//
//   - synchronous=FULL: the log is fsynced at every commit, so an outcome
//     that RunOnce answered survives a power cut, not just a crash;
//   - busy_timeout of BusyTimeout: a writer waits for another's lock rather
//     than failing at once, which is what lets several processes share the
//     file;
//   - foreign_keys=ON, as most schemas expect;
//   - journal_size_limit of 64 MiB: a reader held open under steady writes
//     lets the -wal grow (no checkpoint can pass it), and SQLite's default
//     keeps the file at its largest for ever; with the limit, the first
//     checkpoint after the reader closes truncates it back;
//   - _txlock=immediate: every transaction takes the write lock as it
//     begins, so two transactions that read and then write cannot both
//     hold a snapshot and fail to upgrade (SQLITE_BUSY without waiting).
//
// path is a file's name, not a DSN nor a "file:" URI: every character of
// it, '?', '#' and '%' included, is part of the name. ":memory:" is an
// in-memory database (which New refuses: each pooled connection would get
// its own), and creates no file; an empty path is an error.
//
// A file that Open creates is readable and writable by its owner only
// (0600), whatever the umask, as package bolt's are; SQLite gives the
// -wal, -shm and journal files the database file's permissions. A file
// that already exists keeps the permissions it has (an operator chose
// them), and so do its -wal and -shm: Open never changes a mode.
//
// The caller closes the *sql.DB after the Stores that use it. To bring
// another driver, open the database with the same settings in its DSN and
// pass it to New.
func Open(path string) (*sql.DB, error) {
	if path == "" {
		return nil, errors.New("sqlite: Open with an empty path: name a file")
	}
	if err := create(path); err != nil {
		return nil, fmt.Errorf("sqlite: creating %s: %w", path, err)
	}
	q := url.Values{}
	q.Add("_pragma", "synchronous(FULL)")
	q.Add("_pragma", fmt.Sprintf("busy_timeout(%d)", BusyTimeout.Milliseconds()))
	q.Add("_pragma", "foreign_keys(ON)")
	q.Add("_pragma", fmt.Sprintf("journal_size_limit(%d)", journalSizeLimit))
	q.Set("_txlock", "immediate")
	db, err := sql.Open("sqlite", "file:"+uriPath.Replace(path)+"?"+q.Encode())
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), BusyTimeout)
		defer cancel()
		if err = setWAL(ctx, db); err != nil {
			db.Close()
		}
	}
	if err != nil {
		return nil, fmt.Errorf("sqlite: opening %s: %w", path, err)
	}
	return db, nil
}

// create makes the database file at path, empty and 0600, unless something
// is there already. SQLite would make it 0644 less the umask, and the -wal
// and -shm after it, since its unix VFS gives those the database file's
// mode (and fchmods them to it, whatever the umask).
//
// O_EXCL: an existing file is never opened, so its mode stays, and so does
// every lock this process holds on it (closing any descriptor of a file
// drops the process's POSIX locks on it). An empty file is a valid, empty
// database, so one left behind by a later failure, or that another process
// opens at once, is harmless. A dangling symlink at path is "there
// already": SQLite then creates its target, with its own default mode.
func create(path string) error {
	if path == ":memory:" {
		return nil // SQLite's name for a database without a file
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return nil
	}
	if err != nil {
		return err
	}
	return f.Close()
}

// setWAL puts the database in WAL mode, which the file then keeps. Not in
// the DSN: a new file starts in rollback mode, and when several processes
// switch it at once SQLite refuses all but one at once with SQLITE_BUSY,
// without calling the busy handler (a lock upgrade that could deadlock).
// So the switch is tried again, with a backoff, until ctx ends.
func setWAL(ctx context.Context, db *sql.DB) error {
	for wait := time.Millisecond; ; wait = min(2*wait, 50*time.Millisecond) {
		var mode string
		err := db.QueryRowContext(ctx, `PRAGMA journal_mode=WAL`).Scan(&mode)
		switch {
		case err == nil && (strings.EqualFold(mode, "wal") || strings.EqualFold(mode, "memory")):
			return nil
		case err == nil:
			return fmt.Errorf("the database stays in journal mode %q, not WAL", mode)
		case !busy(err):
			return closedErr(err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("setting WAL mode: %w (%w)", err, ctx.Err())
		case <-time.After(wait):
		}
	}
}

// journalSizeLimit is the size, in bytes, a checkpoint truncates the -wal
// file to (a variable so that a test can bound it lower).
var journalSizeLimit = 64 << 20

// uriPath escapes what would end a path in a file: URI early, or be read
// as an escape.
var uriPath = strings.NewReplacer("%", "%25", "?", "%3f", "#", "%23")
