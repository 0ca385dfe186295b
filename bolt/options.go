package bolt

import (
	"os"
	"time"
)

// Options configure a Backend. A nil *Options, like every zero field, means
// the documented defaults.
type Options struct {
	// LockTimeout bounds how long Open waits for a file that another process
	// (or another Open in this one) holds, before it fails with ErrLocked.
	// Zero means one second; negative means fail at once.
	LockTimeout time.Duration

	// FileMode is the permission of a file Open creates. Zero means 0600.
	FileMode os.FileMode

	// MaxBatch bounds how many operations one commit groups. Zero means
	// 1024.
	MaxBatch int

	// ReadOnly opens an existing idem file for reading only, as an
	// operator's tool does: Get and Each work, every write returns
	// ErrReadOnly, and nothing is written to the file, not even the marks
	// Open otherwise puts on claims an earlier process left pending; Get and
	// Each report those as interrupted all the same, since no writer can
	// hold the file while it is open read-only. Several read-only openers
	// may share a file; none may while a writer holds it. False opens, or creates, the
	// file for reading and writing.
	ReadOnly bool

	// SkipCheck skips the check of the file's structure at Open: every
	// page reachable from its meta is read from the file, before bbolt
	// reads any (each page once, within the file, every element within its
	// page, a freelist that names only unused pages within the file), then
	// every record's size. It reads every page in use, value pages
	// included: its cost grows with the file (bench it on yours). The check
	// is what turns a damaged file into ErrCorrupt at Open rather than a
	// hang, a crash or a file that grows without bound. False checks; set
	// it only for files too large to read at every start, and run "idem
	// check FILE" on them instead.
	SkipCheck bool

	// noSync skips fsync: for tests that measure memory, not durability.
	noSync bool
}

const (
	defaultLockTimeout = time.Second
	defaultFileMode    = 0o600
	defaultMaxBatch    = 1024
)

func (o *Options) withDefaults() Options {
	var opts Options
	if o != nil {
		opts = *o
	}
	switch {
	case opts.LockTimeout == 0:
		opts.LockTimeout = defaultLockTimeout
	case opts.LockTimeout < 0:
		opts.LockTimeout = time.Nanosecond // bbolt reads zero as "wait forever"
	}
	if opts.FileMode == 0 {
		opts.FileMode = defaultFileMode
	}
	if opts.MaxBatch <= 0 {
		opts.MaxBatch = defaultMaxBatch
	}
	return opts
}
