package idemtest

import (
	"context"
	"testing"
	"time"

	"github.com/seed094d4201/idem/backend"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// What a Store relies on to settle a write whose reply was lost: it repeats
// the write, or reads the record back, and compares tokens.
func testRepeatedWrites(t *testing.T, b backend.Backend) {
	ctx := context.Background()
	req := request("k")
	claim, won, err := b.Claim(ctx, req, time.Now(), lease)
	require.NoError(t, err)
	require.True(t, won)

	// A claim sent again after its reply was lost finds itself.
	again, _, err := b.Claim(ctx, req, time.Now(), lease)
	require.NoError(t, err)
	assert.Equal(t, req.Token, again.Token, "a repeated claim must return the record that holds its own token")
	assert.Equal(t, backend.StatePending, again.State)

	// A Complete sent again finds its own outcome recorded.
	require.NoError(t, b.Complete(ctx, outcome(claim, "v"), time.Now(), ttl))
	assert.ErrorIs(t, b.Complete(ctx, outcome(claim, "v"), time.Now(), ttl), backend.ErrNotOwner)
	rec, ok := get(t, b, "k")
	require.True(t, ok)
	assertOutcome(t, claim, "v", rec)

	// A Release sent again finds the key free.
	other := claimKey(t, b, "other", lease)
	require.NoError(t, b.Release(ctx, "other", other.Token))
	assert.ErrorIs(t, b.Release(ctx, "other", other.Token), backend.ErrNotOwner)
	_, ok = get(t, b, "other")
	assert.False(t, ok)
}

// testBuffersNotShared: a backend copies what it is given and what it
// hands back. A Store reuses neither, but a backend that keeps the
// caller's Value slice (or hands out its own) lets a caller's later write
// change a recorded outcome, which every replay would then answer.
func testBuffersNotShared(t *testing.T, b backend.Backend) {
	claim := claimKey(t, b, "k", lease)
	done := outcome(claim, "original")
	require.NoError(t, b.Complete(context.Background(), done, time.Now(), ttl))
	copy(done.Value, "CHANGED!")
	rec, ok := get(t, b, "k")
	require.True(t, ok)
	assert.Equal(t, "original", string(rec.Value), "Complete kept the caller's Value slice")
	if len(rec.Value) > 0 {
		rec.Value[0] = 'X'
	}
	again, _ := get(t, b, "k")
	assert.Equal(t, "original", string(again.Value), "Get handed out the backend's own Value slice")
}

// testCallsAfterClose: a backend that can be closed (an io.Closer, as bolt
// and MemoryBackend are) refuses every call after Close with an error
// matching backend.ErrClosed, so that a Store over it says "closed", not
// "unreachable", and never writes through a handle that is gone.
func testCallsAfterClose(t *testing.T, b backend.Backend) {
	closer, ok := b.(interface{ Close() error })
	if !ok {
		t.Skip("the backend has no Close")
	}
	live := claimKey(t, b, "live", lease)
	require.NoError(t, closer.Close())
	ctx, now := context.Background(), time.Now()
	_, _, err := b.Claim(ctx, request("new"), now, lease)
	assert.ErrorIs(t, err, backend.ErrClosed, "Claim")
	assert.ErrorIs(t, b.Complete(ctx, outcome(live, "v"), now, ttl), backend.ErrClosed, "Complete")
	assert.ErrorIs(t, b.Release(ctx, "live", live.Token), backend.ErrClosed, "Release")
	assert.ErrorIs(t, b.Renew(ctx, "live", live.Token, now, lease), backend.ErrClosed, "Renew")
	_, _, err = b.Get(ctx, "live", now)
	assert.ErrorIs(t, err, backend.ErrClosed, "Get")
	assert.ErrorIs(t, b.Forget(ctx, "live", now), backend.ErrClosed, "Forget")
	_, err = b.Sweep(ctx, now, 10)
	assert.ErrorIs(t, err, backend.ErrClosed, "Sweep")
	if l, ok := b.(backend.Lister); ok {
		assert.ErrorIs(t, l.Each(ctx, func(backend.Record) error { return nil }), backend.ErrClosed, "Each")
	}
}
