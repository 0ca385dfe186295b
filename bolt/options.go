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

	// Check says when Open reads the whole file to check its structure
	// before it serves: every page reachable from its meta is read from
	// the file, before bbolt reads any (each page once, within the file,
	// every element within its page, a freelist that names only unused
	// pages within the file), then every record's size. That check is what
	// finds a damaged file at Open; it reads every page in use (about
	// 1.3 s per GB warm: bench/README.md), so its cost grows with the
	// file. Whatever Check says, Open checks the meta pages and the pages
	// it reads itself (the root, meta and pending buckets, the freelist's
	// bounds); then each call reads, from the file, the pages of idem's
	// buckets that bbolt is about to read for it (a few a call, one a
	// level of the tree), checks those Open did not, and walks them
	// itself, so that damage it meets is ErrCorrupt, never a hang, a crash
	// or a file that grows without bound. What a fn given a *bbolt.Tx (RunOnceTx,
	// Update, View) reads through it, such as buckets of your own, bbolt
	// reads unchecked: only the whole check looks at those pages. The
	// zero value, CheckUnclean, checks the whole file unless this
	// package's Close was the last to write it, with no claim pending.
	Check Check

	// noSync skips fsync: for tests that measure memory, not durability.
	noSync bool
}

// Check is when Open checks the whole file (Options.Check).
type Check int

const (
	// CheckUnclean checks the whole file unless its last write was a
	// clean Close, with no claim pending, of a session that had checked
	// it: after a process was killed or a machine crashed with the file
	// open, after a torn last commit, after another program wrote it,
	// after damage to its meta or its freelist, and after a session
	// opened with CheckNever. A file closed cleanly starts in a time that
	// does not grow with it. A change made to a closed file without a
	// commit (a failing disk, a bad copy, bbolt's surgery on data pages)
	// is then not looked for at Open, but met as ErrCorrupt by the calls
	// that read it: run "idem check FILE" on a file you doubt, or open it
	// with CheckAlways, to find it all at once.
	CheckUnclean Check = iota

	// CheckAlways checks the whole file at every Open.
	CheckAlways

	// CheckNever skips the whole-file check: for files too large to read
	// at any start. Damage is then met as ErrCorrupt by the calls that
	// read it. Run "idem check FILE" on them instead.
	CheckNever
)

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
