package redis

import (
	"context"
	"testing"
	"time"

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
