package main

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/bolt"
	"github.com/seed094d4201/idem/idemhttp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.etcd.io/bbolt"
)

func TestHelpIsOnStdoutAndExitsZero(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"-h"}, {"help"}, {"inspect", "-h"}} {
		code, out, errs := runCmd(args...)
		assert.Equal(t, 0, code, "%v", args)
		assert.Contains(t, out, "usage:", "%v", args)
		assert.Contains(t, out, "exit status: 0 done, 1 failed, 2 misused, 3 no such key")
		assert.Empty(t, errs)
	}
}

func TestMisuseSaysWhy(t *testing.T) {
	path := fixture(t)
	for _, tc := range []struct {
		args []string
		why  string
	}{
		{nil, "no command given"},
		{[]string{"frobnicate", path}, `unknown command "frobnicate"`},
		{[]string{"show", path}, "want WHERE KEY, got 1 argument(s)"},
		{[]string{"inspect", path, "-bogus"}, "flag provided but not defined: -bogus"},
		{[]string{"forget", path, ""}, "invalid key: empty"},
		{[]string{"inspect", path, "-state", "weird"}, `-state "weird"`},
		{[]string{"show", path, "k", "-state", "pending"}, "-state goes with inspect"},
	} {
		code, _, errs := runCmd(tc.args...)
		assert.Equal(t, 2, code, "%v", tc.args)
		assert.Contains(t, errs, tc.why, "%v", tc.args)
		// The reason and where help is, two lines; not the whole usage,
		// which buried the reason.
		assert.Equal(t, 2, strings.Count(errs, "\n"), "%v: %s", tc.args, errs)
		assert.Contains(t, errs, "Run 'idem help' for usage.")
		assert.NotContains(t, errs, "usage:")
	}
}

// Flags work after the command, and -json and -state shape the output.
func TestFlagsAfterTheCommandJSONAndState(t *testing.T) {
	path := fixture(t)
	code, out, errs := runCmd("inspect", path, "-json", "-state", "completed")
	require.Equal(t, 0, code, errs)
	var views []view
	require.NoError(t, json.Unmarshal([]byte(out), &views), out)
	require.Len(t, views, 3)
	for _, v := range views {
		assert.Contains(t, v.State, "completed")
	}
	code, out, errs = runCmd("show", path, "order-102", "-json")
	require.Equal(t, 0, code, errs)
	var v view
	require.NoError(t, json.Unmarshal([]byte(out), &v), out)
	require.NotNil(t, v.FinalError)
	assert.Equal(t, "card declined", *v.FinalError)
}

func TestForgetOfAKeyThatIsNotThere(t *testing.T) {
	path := fixture(t)
	code, out, errs := runCmd("forget", path, "nokey")
	assert.Equal(t, 3, code)
	assert.NotContains(t, out, "forgot", "nothing was forgotten")
	assert.Contains(t, errs, `no record for this key: "nokey"`)
	assert.Contains(t, errs, "idem inspect "+path)
}

// An HTTP key is found by its scope and Idempotency-Key; an unscoped
// route's, with an empty -scope.
func TestScopeFindsAnHTTPKey(t *testing.T) {
	for _, scope := range []string{"acct-alice", ""} {
		path := filepath.Join(t.TempDir(), "http.db")
		b, err := bolt.Open(path, nil)
		require.NoError(t, err)
		ctx := context.Background()
		rec := backend.Record{Key: idemhttp.StoreKey(scope, "curl-key-1"), Token: "t", State: backend.StatePending}
		_, _, err = b.Claim(ctx, rec, now, time.Hour)
		require.NoError(t, err)
		rec.Value = []byte(`{"status":201}`)
		require.NoError(t, b.Complete(ctx, rec, now, time.Hour))
		require.NoError(t, b.Close())

		code, _, _ := runCmd("show", path, "curl-key-1")
		assert.Equal(t, 3, code, "the bare Idempotency-Key is not the store key")
		code, out, errs := runCmd("show", path, "curl-key-1", "-scope", scope)
		require.Equal(t, 0, code, errs)
		assert.Contains(t, out, strconv.Quote(idemhttp.StoreKey(scope, "curl-key-1")))
	}
}

// inspect and show open a bolt file read-only: an empty file is refused and
// stays empty, and a database is left byte for byte as it was.
func TestReadOnlyCommandsWriteNothing(t *testing.T) {
	empty := filepath.Join(t.TempDir(), "empty.db")
	require.NoError(t, os.WriteFile(empty, nil, 0o600))
	code, _, errs := runCmd("inspect", empty)
	assert.Equal(t, 1, code)
	assert.Contains(t, errs, "not an idem database")
	fi, err := os.Stat(empty)
	require.NoError(t, err)
	assert.Zero(t, fi.Size())

	path := fixture(t)
	before, err := os.ReadFile(path)
	require.NoError(t, err)
	runCmd("inspect", path)
	runCmd("show", path, "order-103")
	after, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, before, after)
}

// A PostgreSQL server that accepts connections and never answers, and a
// Redis nobody listens for: the command ends within its -timeout and names
// what it could not reach.
func TestNetworkCallsAreBounded(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			defer conn.Close() // held open, never answered
		}
	}()
	start := time.Now()
	code, _, errs := runCmd("inspect", "postgres://idem@"+ln.Addr().String()+"/test", "-timeout", "300ms")
	assert.Equal(t, 1, code)
	assert.Less(t, time.Since(start), 5*time.Second, "inspect hung on a server that never answers")
	assert.Contains(t, errs, ln.Addr().String())

	dead, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := dead.Addr().String()
	dead.Close()
	code, out, errs := runCmd("inspect", "redis://"+addr, "-timeout", "2s")
	assert.Equal(t, 1, code)
	assert.Contains(t, errs, "cannot reach Redis at "+addr)
	assert.NotContains(t, out+errs, "connection pool")
}

// check reports a sound file, and a damaged one with exit 1.
func TestCheck(t *testing.T) {
	path := fixture(t)
	code, out, errs := runCmd("check", path)
	require.Equal(t, 0, code, errs)
	assert.Contains(t, out, "no damage found")
	assert.Contains(t, out, "4 record(s)")

	db, err := bbolt.Open(path, 0o600, nil) // a record whose bytes are not a record
	require.NoError(t, err)
	require.NoError(t, db.Update(func(tx *bbolt.Tx) error {
		return tx.Bucket([]byte("idem.records")).Put([]byte("order-104"), []byte("garbage"))
	}))
	require.NoError(t, db.Close())
	code, _, errs = runCmd("check", path)
	assert.Equal(t, 1, code)
	assert.Contains(t, errs, "corrupt")
	assert.Contains(t, errs, "order-104")
}
