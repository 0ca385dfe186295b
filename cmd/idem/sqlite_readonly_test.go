package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/sqlite"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// names lists dir's entries.
func names(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	require.NoError(t, err)
	var out []string
	for _, e := range es {
		out = append(out, e.Name())
	}
	slices.Sort(out)
	return out
}

// sqliteStore fills a database at path with key -> 7 and leaves it open.
func sqliteStore(t *testing.T, path, key string) (*idem.Store[int], func()) {
	t.Helper()
	db, err := sqlite.Open(path)
	require.NoError(t, err)
	b, err := sqlite.New(context.Background(), db, sqlite.Options{})
	require.NoError(t, err)
	s := idem.New[int](idem.Options{Backend: b})
	_, err = s.RunOnce(context.Background(), key, "p", func(context.Context) (int, error) { return 7, nil })
	require.NoError(t, err)
	return s, func() { s.Close(); db.Close() }
}

// inspect and show on a database no process has open write nothing beside
// it: no -wal, no -shm (SQLite's read-only mode made both, and left them
// behind, on every run).
func TestSQLiteReadOnlyWritesNothingBeside(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "shop.db")
	_, closeAll := sqliteStore(t, path, "order-101")
	closeAll()
	before := names(t, dir)
	require.Equal(t, []string{"shop.db"}, before)

	code, out, errs := runCmd("inspect", "sqlite:"+path)
	require.Equal(t, 0, code, errs)
	assert.Contains(t, out, `"order-101"  completed`)
	code, _, errs = runCmd("show", "sqlite:"+path, "order-101")
	require.Equal(t, 0, code, errs)
	assert.Equal(t, before, names(t, dir), "a read-only command wrote beside the file")
}

// On a database a service has open, inspect reads the commits still in
// its log (not yet checkpointed into the file), and the service goes on.
func TestSQLiteReadOnlyReadsALiveLog(t *testing.T) {
	path := filepath.Join(t.TempDir(), "shop.db")
	s, closeAll := sqliteStore(t, path, "order-101")
	defer closeAll()
	_, err := os.Stat(path + "-wal")
	require.NoError(t, err, "the service's log is there")

	code, out, errs := runCmd("inspect", "sqlite:"+path)
	require.Equal(t, 0, code, errs)
	assert.Contains(t, out, `"order-101"  completed`)
	_, err = s.RunOnce(context.Background(), "order-102", "p", func(context.Context) (int, error) { return 8, nil })
	require.NoError(t, err, "the service still writes")
	code, out, errs = runCmd("show", "sqlite:"+path, "order-102")
	require.Equal(t, 0, code, errs)
	assert.Contains(t, out, "8")
}

// On a read-only mount (a backup, a snapshot), inspect reads a database
// no process had open; of one whose process stopped without closing it
// (its -wal beside it, no -shm) it says why it cannot, not which table.
func TestSQLiteReadOnlyMount(t *testing.T) {
	for _, unclean := range []bool{false, true} {
		src := filepath.Join(t.TempDir(), "shop.db")
		_, closeAll := sqliteStore(t, src, "order-101")
		dir := t.TempDir()
		copyFile := func(suffix string) {
			b, err := os.ReadFile(src + suffix)
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(filepath.Join(dir, "shop.db"+suffix), b, 0o600))
		}
		if unclean {
			copyFile("")
			copyFile("-wal") // as a SIGKILL leaves it, the commits in it
			closeAll()
		} else {
			closeAll()
			copyFile("")
		}
		mnt := readOnlyMount(t, dir)
		before := names(t, mnt)
		code, out, errs := runCmd("inspect", "sqlite:"+filepath.Join(mnt, "shop.db"))
		t.Logf("unclean %v: exit %d, %s%s", unclean, code, out, errs)
		if unclean {
			// SQLite cannot read a log without a -shm, nor make one there.
			assert.Equal(t, 1, code)
			assert.Contains(t, errs, "read-only directory cannot hold")
			assert.NotContains(t, errs, "table idem_keys", "the cause, not the first table read")
		} else {
			assert.Equal(t, 0, code, "a cleanly closed database reads on a read-only mount")
			assert.Contains(t, out, `"order-101"  completed`)
		}
		assert.Equal(t, before, names(t, mnt))
	}
}

// readOnlyMount bind-mounts dir read-only and returns where, unmounted at
// cleanup; it skips where the process may not mount (not root).
func readOnlyMount(t *testing.T, dir string) string {
	t.Helper()
	mnt := t.TempDir()
	if out, err := exec.Command("mount", "--bind", dir, mnt).CombinedOutput(); err != nil {
		t.Skipf("cannot bind-mount here (%v: %s): the read-only mount is not tried", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", mnt).Run() })
	if out, err := exec.Command("mount", "-o", "remount,bind,ro", mnt).CombinedOutput(); err != nil {
		t.Skipf("cannot remount read-only here (%v: %s)", err, out)
	}
	require.Error(t, os.WriteFile(filepath.Join(mnt, "probe"), nil, 0o600), "the mount is read-only")
	return mnt
}

// A database reached through a symlink, with a service holding it open:
// its -wal is beside the target, and inspect reads it (it was read
// immutable, as if no process had it open, and its commits in the log
// were missed).
func TestSQLiteReadOnlyThroughASymlink(t *testing.T) {
	path := filepath.Join(t.TempDir(), "real.db")
	_, closeAll := sqliteStore(t, path, "order-101")
	defer closeAll()
	link := filepath.Join(t.TempDir(), "link.db")
	require.NoError(t, os.Symlink(path, link))
	code, out, errs := runCmd("inspect", "sqlite:"+link)
	require.Equal(t, 0, code, errs)
	assert.Contains(t, out, `"order-101"  completed`)
}
