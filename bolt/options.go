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
