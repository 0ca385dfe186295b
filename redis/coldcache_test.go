package redis

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/seed094d4201/idem/backend"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Every call finds the server's script cache cold (a restarted or flushed
// server: EVALSHA answers NOSCRIPT) and still does its work: run sends the
// script whole then.
func TestEveryCallOnAColdScriptCache(t *testing.T) {
	rdb := testClient(t)
	b := testBackend(t, rdb)
	ctx := context.Background()
	cold := func() { require.NoError(t, rdb.ScriptFlush(ctx).Err()) }

	cold()
	rec, won, err := b.Claim(ctx, backend.Record{Key: "k", Token: "t"}, time.Now(), time.Minute)
	require.NoError(t, err)
	require.True(t, won)
	cold()
	require.NoError(t, b.Renew(ctx, "k", "t", time.Now(), time.Minute))
	cold()
	require.NoError(t, b.RecordStep(ctx, "k", "t", backend.Step{Name: "s", Value: []byte("v")}, time.Now()))
	cold()
	got, ok, err := b.Get(ctx, "k", time.Now())
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, backend.StatePending, got.State)
	assert.Len(t, got.Steps, 1)
	cold()
	rec.Value = []byte("done")
	require.NoError(t, b.Complete(ctx, rec, time.Now(), time.Minute))
	cold()
	got, ok, err = b.Get(ctx, "k", time.Now())
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, backend.StateCompleted, got.State)
	assert.Equal(t, "done", string(got.Value))
	cold()
	require.NoError(t, b.Forget(ctx, "k", time.Now()))
	cold()
	_, ok, err = b.Get(ctx, "k", time.Now())
	require.NoError(t, err)
	assert.False(t, ok, "a Get of a missing key on a cold cache is not found, not an error")

	_, _, err = b.Claim(ctx, backend.Record{Key: "r", Token: "t"}, time.Now(), time.Minute)
	require.NoError(t, err)
	cold()
	require.NoError(t, b.Release(ctx, "r", "t"))
	cold()
	assert.ErrorIs(t, b.Release(ctx, "r", "t"), backend.ErrNotOwner)
}

// The calls TestEveryCallOnAColdScriptCache leaves out, on a cold script
// cache (a restarted or failed-over server, SCRIPT FLUSH): Resume of a
// lapsed claim, and Sweep deleting a legacy index. Each goes through run,
// which must send the script whole on NOSCRIPT, never fail with it.
func TestResumeAndSweepOnAColdScriptCache(t *testing.T) {
	rdb := testClient(t)
	b := testBackend(t, rdb)
	ctx := context.Background()
	cold := func() { require.NoError(t, rdb.ScriptFlush(ctx).Err()) }

	_, won, err := b.Claim(ctx, backend.Record{Key: "k", Token: "old"}, time.Now(), 200*time.Millisecond)
	require.NoError(t, err)
	require.True(t, won)
	require.NoError(t, b.RecordStep(ctx, "k", "old", backend.Step{Name: "charge", Value: []byte("ch_1")}, time.Now()))
	deadline := time.Now().Add(10 * time.Second)
	for { // the server's clock lapses the lease
		rec, ok, err := b.Get(ctx, "k", time.Now())
		require.NoError(t, err)
		require.True(t, ok)
		if rec.State == backend.StateInterrupted {
			break
		}
		require.True(t, time.Now().Before(deadline), "the lease never lapsed")
		time.Sleep(5 * time.Millisecond)
	}
	cold()
	rec, err := b.Resume(ctx, "k", "old", "new", time.Now(), time.Minute)
	require.NoError(t, err, "Resume on a cold script cache")
	assert.Equal(t, "new", rec.Token)
	assert.Equal(t, backend.StatePending, rec.State)
	require.Len(t, rec.Steps, 1)
	assert.Equal(t, "ch_1", string(rec.Steps[0].Value))

	require.NoError(t, rdb.ZAdd(ctx, b.legacyIndex, redis.Z{Score: 1, Member: "k"}).Err())
	cold()
	_, err = b.Sweep(ctx, time.Now(), 100)
	require.NoError(t, err, "Sweep on a cold script cache")
	n, err := rdb.Exists(ctx, b.legacyIndex).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "the legacy index was not deleted")
}
