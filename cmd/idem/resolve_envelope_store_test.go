package main

import (
	"context"
	"encoding/json"
	"path/filepath"
	"testing"
	"time"

	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/bolt"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A store whose results are an application's own envelope, {"code": 3,
// "message": "done"} (fields that an idemgrpc reply also has, "done"
// reading as base64), is no store of idemgrpc replies: those write a
// message as a google.protobuf.Any and an error's code with its status.
// resolve takes a -result of the envelope's shape there, which decodes as
// the store's results do.
func TestResolveOnAnEnvelopeStoreIsNotJudgedAsGRPC(t *testing.T) {
	for _, sample := range []envelope{{Code: 3, Message: "done"}, {Code: 3}} {
		path := filepath.Join(t.TempDir(), "envelope.db")
		b, err := bolt.Open(path, nil)
		require.NoError(t, err)
		ctx := context.Background()
		v, err := json.Marshal(sample)
		require.NoError(t, err)
		done := backend.Record{Key: "order-1", Token: "t1", State: backend.StatePending}
		_, claimed, err := b.Claim(ctx, done, time.Now(), time.Minute)
		require.NoError(t, err)
		require.True(t, claimed)
		done.State, done.Value = backend.StateCompleted, v
		require.NoError(t, b.Complete(ctx, done, time.Now(), time.Hour))
		_, claimed, err = b.Claim(ctx, backend.Record{Key: "order-9", Token: "dead-owner", State: backend.StatePending},
			time.Now().Add(-time.Hour), time.Millisecond)
		require.NoError(t, err)
		require.True(t, claimed)
		require.NoError(t, b.Close())

		result := `{"code":0,"message":"refunded by hand"}`
		var e envelope
		require.NoError(t, json.Unmarshal([]byte(result), &e), "the store's results decode it")
		code, out, errs := runCmd("resolve", path, "order-9", "-result", result)
		assert.Equal(t, 0, code, "%s: %s", v, errs)
		assert.Contains(t, out, "resolved", string(v))
	}
}

type envelope struct {
	Code    int    `json:"code"`
	Message string `json:"message,omitempty"`
}
