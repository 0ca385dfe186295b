package main

import (
	"context"
	"encoding/json"
	"path/filepath"
	"testing"
	"time"

	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/bolt"
	"github.com/seed094d4201/idem/idemgrpc"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
)

// On a store of idemgrpc replies, resolve judges a -result's code as the
// store's Codec decodes it (codes.Code's JSON form): a code by its name
// ("FAILED_PRECONDITION") is a final error every replay sends, and field
// names in another case decode as encoding/json matches them, so both are
// taken; a number no code has (99, -1) fails to decode on every call, so
// it is refused. Each is checked against what the Codec makes of it.
func TestResolveOnAGRPCStoreJudgesCodesAsTheCodecReadsThem(t *testing.T) {
	good := []string{`{"code":"FAILED_PRECONDITION","error":"order closed"}`, `{"Code":9,"Error":"order closed"}`}
	bad := []string{`{"code":99,"error":"order closed"}`, `{"code":-1,"error":"order closed"}`}
	for _, v := range good {
		var r idemgrpc.Reply
		require.NoError(t, json.Unmarshal([]byte(v), &r), v)
		require.Equal(t, codes.FailedPrecondition, r.Code, v)
	}
	for _, v := range bad {
		var r idemgrpc.Reply
		require.Error(t, json.Unmarshal([]byte(v), &r), v)
	}
	for _, v := range good {
		path := grpcStoreWithAnInterruptedKey(t)
		code, out, errs := runCmd("resolve", path, "order-9", "-result", v)
		assert.Equal(t, 0, code, "%s: %s", v, errs)
		assert.Contains(t, out, "resolved", v)
	}
	for _, v := range bad {
		path := grpcStoreWithAnInterruptedKey(t)
		code, _, errs := runCmd("resolve", path, "order-9", "-result", v)
		assert.Equal(t, 1, code, v)
		assert.Contains(t, errs, "idemgrpc replies", v)
	}
}

// grpcStoreWithAnInterruptedKey returns a bolt file holding one completed
// idemgrpc reply (order-1) and an interrupted claim (order-9).
func grpcStoreWithAnInterruptedKey(t *testing.T) string {
	t.Helper()
	sample, err := json.Marshal(idemgrpc.Reply{Message: []byte("\x0a\x05type/\x12\x00"), Code: codes.OK})
	require.NoError(t, err)
	return storeWithAnInterruptedKey(t, sample)
}

// storeWithAnInterruptedKey returns a bolt file holding one completed
// record whose value is sample (order-1) and an interrupted claim
// (order-9).
func storeWithAnInterruptedKey(t *testing.T, sample []byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "store.db")
	b, err := bolt.Open(path, nil)
	require.NoError(t, err)
	ctx := context.Background()
	done := backend.Record{Key: "order-1", Token: "t1", State: backend.StatePending}
	_, claimed, err := b.Claim(ctx, done, time.Now(), time.Minute)
	require.NoError(t, err)
	require.True(t, claimed)
	done.State, done.Value = backend.StateCompleted, sample
	require.NoError(t, b.Complete(ctx, done, time.Now(), time.Hour))
	_, claimed, err = b.Claim(ctx, backend.Record{Key: "order-9", Token: "dead-owner", State: backend.StatePending},
		time.Now().Add(-time.Hour), time.Millisecond)
	require.NoError(t, err)
	require.True(t, claimed)
	require.NoError(t, b.Close())
	return path
}
