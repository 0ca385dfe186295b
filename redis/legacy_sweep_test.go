package redis

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Sweep deletes <prefix>expiry only when it is the legacy index, a sorted
// set: an application's own key of that name under the prefix stays (it
// once went at every sweep, whatever it was).
func TestSweepDeletesOnlyTheLegacySortedSet(t *testing.T) {
	rdb := testClient(t)
	ctx := context.Background()
	var r [4]byte
	_, _ = rand.Read(r[:])
	prefix := "app" + hex.EncodeToString(r[:]) + ":"
	t.Cleanup(func() { rdb.Del(ctx, prefix+"expiry") })

	require.NoError(t, rdb.ZAdd(ctx, prefix+"expiry", redis.Z{Member: "k", Score: 1}).Err())
	_, err := New(rdb, Options{Prefix: prefix}).Sweep(ctx, time.Now(), 100)
	require.NoError(t, err)
	n, err := rdb.Exists(ctx, prefix+"expiry").Result()
	require.NoError(t, err)
	assert.Zero(t, n, "the legacy index stays")

	require.NoError(t, rdb.HSet(ctx, prefix+"expiry", "session-ttl", "3600").Err())
	_, err = New(rdb, Options{Prefix: prefix}).Sweep(ctx, time.Now(), 100)
	require.NoError(t, err)
	n, err = rdb.Exists(ctx, prefix+"expiry").Result()
	require.NoError(t, err)
	assert.Equal(t, int64(1), n, "Sweep deleted a hash the backend never wrote")
}
