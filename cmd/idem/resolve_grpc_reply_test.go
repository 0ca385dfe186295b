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

// On a store of idemgrpc replies, resolve refuses a -result with neither a
// message nor a final error's code ('{}', a code of 0, a field no reply
// has): the shape check let any object through, and every replay of it
// failed as Internal. A final error, code and message, is taken.
func TestResolveOnAGRPCStoreWantsAReply(t *testing.T) {
	path := filepath.Join(t.TempDir(), "grpc.db")
	b, err := bolt.Open(path, nil)
	require.NoError(t, err)
	ctx := context.Background()
	sample, err := json.Marshal(idemgrpc.Reply{Message: []byte("\x0a\x05type/\x12\x00"), Code: codes.OK})
	require.NoError(t, err)
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

	for _, bad := range []string{`{}`, `{"code":0}`, `{"error":"closed"}`, `{"code":9,"eror":"closed"}`} {
		code, _, errs := runCmd("resolve", path, "order-9", "-result", bad)
		assert.Equal(t, 1, code, bad)
		assert.Contains(t, errs, "idemgrpc replies", bad)
	}
	code, out, errs := runCmd("resolve", path, "order-9", "-result", `{"code":9,"error":"order closed"}`)
	require.Equal(t, 0, code, errs)
	assert.Contains(t, out, "resolved")
}
