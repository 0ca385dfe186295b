package sqlite

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/internal/svctest"
	"github.com/stretchr/testify/require"
)

// tinyDisk returns a directory on a file system of size bytes of its own,
// or skips the test where one cannot be mounted (not root, no tmpfs);
// in CI, which runs as root, it fails instead (svctest.Skipf).
func tinyDisk(t *testing.T, size string) string {
	t.Helper()
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", dir).CombinedOutput(); err != nil {
		svctest.Skipf(t, "cannot mount a small tmpfs: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", "-l", dir).Run() })
	return dir
}

// fill writes to dir until its file system is full.
func fill(t *testing.T, dir string) {
	t.Helper()
	f, err := os.Create(filepath.Join(dir, "filler"))
	require.NoError(t, err)
	defer f.Close()
	chunk := make([]byte, 4096)
	for {
		if _, err := f.Write(chunk); err != nil {
			return
		}
	}
}

// A sweep whose transaction cannot commit (a full disk) deleted nothing,
// and says so: it returned the count of the deletions its rolled-back
// transaction had made, which a Store's Sweep and its Observer reported
// as swept.
func TestSweepOnAFullDiskCountsNothing(t *testing.T) {
	dir := tinyDisk(t, "2m")
	db, err := Open(filepath.Join(dir, "idem.db"))
	require.NoError(t, err)
	defer db.Close()
	ctx := context.Background()
	b, err := New(ctx, db, Options{})
	require.NoError(t, err)
	now := time.Now()
	// Records until the disk is full.
	value := make([]byte, 64<<10)
	keys := 0
	for ; ; keys++ {
		k := fmt.Sprintf("k%d", keys)
		_, _, err := b.Claim(ctx, backend.Record{Key: k, Token: "t", State: backend.StatePending}, now, time.Minute)
		if err == nil {
			err = b.Complete(ctx, backend.Record{Key: k, Token: "t", State: backend.StateCompleted, Value: value}, now, time.Second)
		}
		if err != nil {
			require.Positive(t, keys, "the disk was full before the first record")
			break
		}
	}
	fill(t, dir)
	n, err := b.Sweep(ctx, now.Add(time.Hour), 1000)
	require.Error(t, err, "the sweep committed on a full disk: the test judges nothing")
	left := 0
	require.NoError(t, b.Each(ctx, func(r backend.Record) error {
		if r.State == backend.StateCompleted {
			left++
		}
		return nil
	}))
	require.Equal(t, keys-left, n, "Sweep failed with %v and counted %d deleted; %d records are left", err, n, left)
}
