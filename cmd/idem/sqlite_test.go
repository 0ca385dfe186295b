package main

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/bolt"
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

// show lists a key's steps, with their times and outcomes, on each backend
// that records steps.
func TestShowListsSteps(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	at := now.Add(-3 * time.Hour) // whole seconds, UTC: printed as RFC 3339 without a fraction
	first, second := at.Add(time.Second).Format(time.RFC3339), at.Add(2*time.Second).Format(time.RFC3339)
	for _, tc := range []struct {
		name, where string
		open        func(t *testing.T) (backend.Stepper, func())
	}{
		{"bolt", filepath.Join(dir, "steps.bolt"), func(t *testing.T) (backend.Stepper, func()) {
			b, err := bolt.Open(filepath.Join(dir, "steps.bolt"), nil)
			require.NoError(t, err)
			return b, func() { b.Close() }
		}},
		{"sqlite", "sqlite:" + filepath.Join(dir, "steps.db"), func(t *testing.T) (backend.Stepper, func()) {
			db, err := sqlite.Open(filepath.Join(dir, "steps.db"))
			require.NoError(t, err)
			b, err := sqlite.New(ctx, db, sqlite.Options{})
			require.NoError(t, err)
			return b, func() { db.Close() }
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, closeB := tc.open(t)
			claim, _, err := b.Claim(ctx, backend.Record{Key: "order-101", Token: "t"}, at, time.Hour)
			require.NoError(t, err)
			require.NoError(t, b.RecordStep(ctx, "order-101", claim.Token, backend.Step{Name: "create-order", Value: []byte(`{"id":7}`)}, at.Add(time.Second)))
			require.NoError(t, b.RecordStep(ctx, "order-101", claim.Token, backend.Step{Name: "charge", Failed: true, ErrMsg: "card declined"}, at.Add(2*time.Second)))
			closeB()

			code, out, errs := runCmd("show", tc.where, "order-101")
			require.Equal(t, 0, code, errs)
			assert.Contains(t, out, "steps:\n"+
				"  1. \"create-order\" at "+first+": {\"id\":7}\n"+
				"  2. \"charge\" at "+second+": final error \"card declined\"\n")
			code, out, errs = runCmd("show", tc.where, "order-101", "-json")
			require.Equal(t, 0, code, errs)
			assert.Contains(t, out, `"steps":[{"name":"create-order","at":"`+first+`","value":"{\"id\":7}"},{"name":"charge","at":"`+second+`","final_error":"card declined","value":""}]`)
		})
	}
}
