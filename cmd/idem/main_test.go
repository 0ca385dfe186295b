package main

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/bolt"
	"github.com/seed094d4201/idem/internal/svctest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(svctest.M(m)) }

// now is the commands' clock in these tests. It is read from the real
// clock, not pinned to a date: what the commands record (a resolved key's
// TTL, say) is later judged by stores and servers on the real clock, which
// must not find it expired. Whole seconds keep the printed ages exact.
var now = time.Now().UTC().Truncate(time.Second)

// fixture writes a database with a completed key, a final error, an expired
// key and an interrupted one, and returns its path.
func fixture(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "shop.db")
	b, err := bolt.Open(path, nil)
	require.NoError(t, err)
	ctx := context.Background()
	clock := now.Add(-time.Hour)
	s := idem.New[map[string]int](idem.Options{Backend: b, Now: func() time.Time { return clock }, TTL: 24 * time.Hour})
	_, err = s.RunOnce(ctx, "order-101", "450", func(context.Context) (map[string]int, error) {
		return map[string]int{"charge": 1, "amount": 450}, nil
	})
	require.NoError(t, err)
	_, err = s.RunOnce(ctx, "order-102", "990", func(context.Context) (map[string]int, error) {
		return nil, idem.Final(errors.New("card declined"))
	})
	require.True(t, idem.IsFinal(err))
	require.NoError(t, s.Close())

	old := idem.New[int](idem.Options{Backend: b, Now: func() time.Time { return now.Add(-48 * time.Hour) }})
	_, err = old.RunOnce(ctx, "order-007", nil, func(context.Context) (int, error) { return 7, nil })
	require.NoError(t, err)
	require.NoError(t, old.Close())

	// A claim whose process dies: pending now, interrupted on the next Open.
	_, _, err = b.Claim(ctx, backend.Record{Key: "order-103", Token: "dead"}, now.Add(-10*time.Minute), 0)
	require.NoError(t, err)
	require.NoError(t, b.Close())
	return path
}

func runCmd(args ...string) (code int, stdout, stderr string) {
	var out, errs strings.Builder
	code = run(args, &out, &errs, now)
	return code, out.String(), errs.String()
}

func TestInspect(t *testing.T) {
	path := fixture(t)
	code, out, errs := runCmd("inspect", path)
	require.Equal(t, 0, code, errs)
	assert.True(t, strings.HasPrefix(out[strings.Index(out, "\n")+1:], `"order-103"  interrupted`), "interrupted keys come first:\n%s", out)
	for _, want := range []string{
		`"order-101"  completed `,
		`"order-102"  completed (final error)`,
		`"order-007"  completed `,
		`"order-103"  interrupted`,
		"never (waits for an operator)",
		"expired",
		"23h0m0s",
		"4 record(s)",
	} {
		assert.Contains(t, out, want)
	}
}

func TestShowForgetSweep(t *testing.T) {
	path := fixture(t)
	code, out, errs := runCmd("show", path, "order-101")
	require.Equal(t, 0, code, errs)
	assert.Contains(t, out, `value:       {"amount":450,"charge":1}`+"\n", "JSON printed as JSON, not quoted")
	code, out, _ = runCmd("show", path, "order-102")
	require.Equal(t, 0, code)
	assert.Contains(t, out, `final error: "card declined"`)
	code, out, _ = runCmd("show", path, "order-103")
	require.Equal(t, 0, code)
	assert.Contains(t, out, "idem forget "+path+" order-103\n", "the next command names the real target")
	assert.Contains(t, out, "idem resolve "+path+" -result JSON order-103")

	code, out, errs = runCmd("forget", path, "order-103")
	require.Equal(t, 0, code, errs)
	assert.Contains(t, out, `forgot "order-103"`)
	code, _, errs = runCmd("show", path, "order-103")
	assert.Equal(t, 3, code, "no such key has an exit code of its own")
	assert.Contains(t, errs, `no record for this key: "order-103"`)

	code, out, errs = runCmd("sweep", path)
	require.Equal(t, 0, code, errs)
	assert.Contains(t, out, "swept 1 expired record(s)")
	_, out, _ = runCmd("inspect", path)
	assert.Contains(t, out, "2 record(s)")
}

func TestErrors(t *testing.T) {
	code, _, errs := runCmd()
	assert.Equal(t, 2, code)
	assert.Contains(t, errs, "idem help")
	code, _, _ = runCmd("show", "file-only")
	assert.Equal(t, 2, code)

	code, _, errs = runCmd("inspect", filepath.Join(t.TempDir(), "missing.db"))
	assert.Equal(t, 1, code)
	assert.Contains(t, errs, "no such file")

	path := fixture(t)
	held, err := bolt.Open(path, nil)
	require.NoError(t, err)
	defer held.Close()
	code, _, errs = runCmd("inspect", path)
	assert.Equal(t, 1, code)
	assert.Contains(t, errs, "locked by another process")
	assert.Contains(t, errs, "still running")
}

// zeroFingerprint matches the fixture's dead claims, which carry none.
func zeroFingerprint(any) (idem.Fingerprint, error) { return idem.Fingerprint{}, nil }

// A consumer killed after applying order-103 and before recording it: the
// operator resolves the key as done, and a late duplicate replays the
// given outcome instead of running.
func TestResolve(t *testing.T) {
	path := fixture(t)
	code, _, errs := runCmd("resolve", path, "order-103")
	assert.Equal(t, 2, code, "an outcome is required")
	assert.Contains(t, errs, "-result JSON or -error MSG")
	code, _, _ = runCmd("resolve", path, "order-103", "-result", "{not json")
	assert.Equal(t, 2, code)
	code, _, errs = runCmd("resolve", path, "order-101", "-result", `{"charge":9}`)
	assert.Equal(t, 1, code, "a completed key is not resolved again")
	assert.Contains(t, errs, "already has an outcome")

	// A result of another shape than the store's (map[string]int here)
	// would fail to decode on every later call: refused, nothing written.
	for _, bad := range []string{`"a string"`, `[1,2]`, `{"charge":"three"}`} {
		code, _, errs = runCmd("resolve", path, "order-103", "-result", bad)
		assert.Equal(t, 1, code, bad)
		assert.Contains(t, errs, "cannot be what this store holds", bad)
	}

	code, out, errs := runCmd("resolve", path, "order-103", "-result", `{"charge":3,"amount":120}`)
	// (-force would have written any of the refused ones: TestResolveForce.)
	require.Equal(t, 0, code, errs)
	assert.Contains(t, out, `resolved "order-103"`)

	b, err := bolt.Open(path, nil)
	require.NoError(t, err)
	defer b.Close()
	s := idem.New[map[string]int](idem.Options{Backend: b, Fingerprint: zeroFingerprint})
	defer s.Close()
	v, err := s.RunOnce(context.Background(), "order-103", "late duplicate", func(context.Context) (map[string]int, error) {
		t.Error("a resolved key ran again")
		return nil, nil
	})
	require.NoError(t, err)
	assert.Equal(t, map[string]int{"charge": 3, "amount": 120}, v)
}
