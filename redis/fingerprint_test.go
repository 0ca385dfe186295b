package redis

import (
	"context"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestCompleteKeepsFingerprintOfOldValue: the script copies the stored
// fingerprint into the outcome's record in every layout, including a value
// written before the header had its created field (the conformance suite
// covers the others).
func TestCompleteKeepsFingerprintOfOldValue(t *testing.T) {
	rdb := testClient(t)
	b := testBackend(t, rdb)
	ctx := context.Background()
	claimed := [32]byte{1, 2, 3, 4, 5}
	enc, err := blob(backend.Record{Key: "old", Fingerprint: claimed, State: backend.StatePending})
	require.NoError(t, err)
	require.NoError(t, rdb.Set(ctx, b.key("old"), "1|0|tok|"+string(enc), 0).Err())

	done := backend.Record{Key: "old", Token: "tok", Fingerprint: idem.Fingerprint{0xde, 0xad}, Value: []byte("v")}
	require.NoError(t, b.Complete(ctx, done, time.Now(), time.Minute))
	rec, ok, err := b.Get(ctx, "old", time.Now())
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, backend.StateCompleted, rec.State)
	assert.Equal(t, claimed, rec.Fingerprint, "Complete kept the claim's fingerprint")
	assert.Equal(t, "v", string(rec.Value))
}
