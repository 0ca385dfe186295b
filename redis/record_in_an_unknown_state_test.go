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

// A value whose header names a state this version does not know (a later
// version's, or a damaged one) reads as damaged, never as a record to act
// on. Before, Get returned it as it was, and a Store's Resolve, finding it
// neither pending nor completed, took it for interrupted, and the complete
// script (which refuses only '2') wrote the operator's outcome over it.
func TestValueInAnUnknownStateReadsAsDamaged(t *testing.T) {
	rdb := testClient(t)
	b := testBackend(t, rdb)
	ctx := context.Background()
	enc, err := backend.Record{Key: "k", State: backend.StatePending}.MarshalBinary()
	require.NoError(t, err)
	stored := "4|0|t|1|" + string(enc)
	require.NoError(t, rdb.Set(ctx, b.key("k"), stored, 0).Err())

	_, _, err = b.Get(ctx, "k", time.Now())
	assert.ErrorContains(t, err, "unknown state", "Get reads the value as damaged")
	_, won, err := b.Claim(ctx, backend.Record{Key: "k", Token: "t2", State: backend.StatePending}, time.Now(), time.Minute)
	assert.ErrorContains(t, err, "unknown state", "Claim reads the value as damaged")
	assert.False(t, won)
	s := idem.New[string](idem.Options{Backend: b})
	t.Cleanup(func() { _ = s.Close() })
	assert.Error(t, s.Resolve(ctx, "k", "resolved", nil))
	got, err := rdb.Get(ctx, b.key("k")).Result()
	require.NoError(t, err)
	assert.Equal(t, stored, got, "the value is left as it was")
}
