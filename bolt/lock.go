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

// holdLock takes, on a descriptor of its own, the lock bbolt takes on the
// file (flock: shared to read, exclusive to write), so that the check of a
// file runs while no writer has it: a check that read a live writer's
// pages mid-commit would call a sound file corrupt. It waits up to timeout,
// then fails with ErrLocked; a missing file is not locked. The caller must
// release it before bbolt.Open, which takes the same lock on its own
// descriptor (flock locks are per open file, not per process) and checks,
// once it holds it, that nobody wrote in between (sameTxid).
func holdLock(path string, readOnly bool, timeout time.Duration) (release func(), err error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return func() {}, nil
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
			return func() { f.Close() }, nil // closing drops the lock
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
