package sqlite

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/seed094d4201/idem"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// withUmask runs the rest of the test under umask, restored when it ends.
// The umask is the process's: a test that calls it must not be parallel.
func withUmask(t *testing.T, umask int) {
	t.Helper()
	old := syscall.Umask(umask)
	t.Cleanup(func() { syscall.Umask(old) })
}

// openAndWrite opens path, writes a record through a Store on it, and
// returns the modes of the database, its -wal and its -shm while the
// database is still open (SQLite removes the -wal and -shm at the last
// close).
func openAndWrite(t *testing.T, path string) map[string]fs.FileMode {
	t.Helper()
	db, err := Open(path)
	require.NoError(t, err)
	defer db.Close()
	b, err := New(context.Background(), db, Options{})
	require.NoError(t, err)
	s := idem.New[int](idem.Options{Backend: b})
	defer s.Close()
	v, err := s.RunOnce(context.Background(), "k", "p", func(context.Context) (int, error) { return 7, nil })
	require.NoError(t, err)
	require.Equal(t, 7, v)
	modes := map[string]fs.FileMode{}
	for _, suffix := range []string{"", "-wal", "-shm"} {
		fi, err := os.Stat(path + suffix)
		require.NoError(t, err, "%s exists after a write", path+suffix)
		modes[suffix] = fi.Mode()
	}
	return modes
}

// Open creates a new database file, and so its -wal and -shm, readable and
// writable by the owner only, as bolt does, whatever the umask lets by.
func TestOpenCreatesOwnerOnlyFiles(t *testing.T) {
	withUmask(t, 0o022)
	dir := t.TempDir()
	path := filepath.Join(dir, "idem.db")
	modes := openAndWrite(t, path)
	for suffix, mode := range modes {
		assert.Equal(t, fs.FileMode(0o600), mode, "mode of %s", path+suffix)
	}
}

// A name with the characters that a file: URI would read otherwise is the
// file's name, and that file is the one made 0600: nothing else appears
// (the -wal and -shm, whose modes openAndWrite saw, go at the last close).
func TestOpenCreatesOwnerOnlyFilesOddName(t *testing.T) {
	withUmask(t, 0o022)
	dir := t.TempDir()
	name := "idem?mode=memory&x=%41#frag.db"
	modes := openAndWrite(t, filepath.Join(dir, name))
	for suffix, mode := range modes {
		assert.Equal(t, fs.FileMode(0o600), mode, "mode of %s", name+suffix)
	}
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	assert.Equal(t, []string{name}, names)
}

// A database file that exists keeps the mode an operator gave it, and its
// -wal and -shm get the same.
func TestOpenKeepsExistingFileMode(t *testing.T) {
	withUmask(t, 0o022)
	path := filepath.Join(t.TempDir(), "idem.db")
	require.NoError(t, os.WriteFile(path, nil, 0o640))
	require.NoError(t, os.Chmod(path, 0o640)) // whatever the umask took
	modes := openAndWrite(t, path)
	for suffix, mode := range modes {
		assert.Equal(t, fs.FileMode(0o640), mode, "mode of %s", path+suffix)
	}
}

// ":memory:" is a database without a file (that New refuses): Open
// creates none. An empty path is an error, and creates none either.
func TestOpenMemoryCreatesNoFile(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	db, err := Open(":memory:")
	require.NoError(t, err)
	_, err = db.Exec(`CREATE TABLE t (x); INSERT INTO t VALUES (1)`)
	require.NoError(t, err)
	require.NoError(t, db.Close())
	_, err = Open("")
	assert.ErrorContains(t, err, "empty path")
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Empty(t, entries)
}

// A file that cannot be created is a clear error that wraps the cause.
func TestOpenCannotCreate(t *testing.T) {
	path := filepath.Join(t.TempDir(), "missing", "idem.db")
	_, err := Open(path)
	require.Error(t, err)
	assert.ErrorIs(t, err, fs.ErrNotExist)
	assert.ErrorContains(t, err, path)

}
