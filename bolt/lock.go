//go:build unix

package bolt

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"syscall"
	"time"
)

// holdLock opens the file at path and takes, on that descriptor, the lock
// bbolt takes on the file (flock: shared to read, exclusive to write), so
// that the check of a file runs, on that descriptor, while no writer has
// it: a check that read a live writer's pages mid-commit would call a
// sound file corrupt. It waits up to timeout, then fails with ErrLocked; a
// missing file gives a nil file, not locked. Closing the file drops the
// lock, which the caller must do before bbolt.Open, which takes the same
// lock on its own descriptor (flock locks are per open file, not per
// process); openCheckedOnce then checks that bbolt opened the same file,
// unchanged.
func holdLock(path string, readOnly bool, timeout time.Duration) (*os.File, error) {
	flag := os.O_RDWR // an exclusive lock over NFS needs a descriptor open for writing
	if readOnly {
		flag = os.O_RDONLY
	}
	f, err := os.OpenFile(path, flag, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	how := syscall.LOCK_EX
	if readOnly {
		how = syscall.LOCK_SH
	}
	deadline := time.Now().Add(timeout)
	for {
		err := syscall.Flock(int(f.Fd()), how|syscall.LOCK_NB)
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) || !time.Now().Before(deadline) {
			f.Close()
			if errors.Is(err, syscall.EWOULDBLOCK) {
				return nil, fmt.Errorf("%w: %s (waited %v)", ErrLocked, path, timeout)
			}
			return nil, fmt.Errorf("bolt: locking %s: %w", path, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
