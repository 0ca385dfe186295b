//go:build !unix

package bolt

import (
	"errors"
	"io/fs"
	"os"
	"time"
)

// holdLock opens the file at path but locks nothing where flock is not:
// bbolt's own lock, taken at bbolt.Open, is all there is, so a check may
// read a live writer's pages, and call a sound file corrupt.
func holdLock(path string, readOnly bool, _ time.Duration) (*os.File, error) {
	flag := os.O_RDWR
	if readOnly {
		flag = os.O_RDONLY
	}
	f, err := os.OpenFile(path, flag, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	return f, err
}
