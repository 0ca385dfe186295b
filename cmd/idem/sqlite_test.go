package main

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/sqlite"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// inspect and show open a SQLite file read-only: they work on a file no
// process holds, and change nothing in it.
func TestSQLiteReadOnly(t *testing.T) {
	path := filepath.Join(t.TempDir(), "shop.db")
	db, err := sqlite.Open(path)
	require.NoError(t, err)
	b, err := sqlite.New(context.Background(), db, sqlite.Options{})
	require.NoError(t, err)
	s := idem.New[int](idem.Options{Backend: b})
	_, err = s.RunOnce(context.Background(), "order-101", "p", func(context.Context) (int, error) { return 7, nil })
	require.NoError(t, err)
	require.NoError(t, s.Close())
	require.NoError(t, db.Close())
	before, err := os.ReadFile(path)
	require.NoError(t, err)
	st, err := os.Stat(path)
	require.NoError(t, err)

	code, out, errs := runCmd("inspect", "sqlite:"+path)
	require.Equal(t, 0, code, errs)
	assert.Contains(t, out, `"order-101"  completed`)
	code, out, errs = runCmd("show", "sqlite:"+path, "order-101")
	require.Equal(t, 0, code, errs)
	assert.Contains(t, out, "7")
	after, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, before, after, "a read-only command changed the file")
	st2, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, st.ModTime(), st2.ModTime())

	code, _, errs = runCmd("inspect", "sqlite:"+filepath.Join(t.TempDir(), "missing.db"))
	assert.Equal(t, 1, code)
	assert.Contains(t, errs, "no such file")
}
