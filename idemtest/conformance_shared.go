package idemtest

import (
	"context"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// RunShared checks a Backend shared between machines: Run, and that it
// judges every lease and expiry by its server's clock, whatever now a
// caller passes. Stores on hosts whose clocks are off by a minute either way
// must not take over a live claim, forget it, or see a remembered outcome
// as expired.
func RunShared(t *testing.T, newBackend func(t *testing.T) backend.Backend) {
	Run(t, newBackend)
	t.Run("ServerClock", func(t *testing.T) {
		for _, skew := range []time.Duration{time.Minute, -time.Minute, 24 * time.Hour} {
			t.Run(skew.String(), func(t *testing.T) { testServerClock(t, newBackend(t), skew) })
		}
	})
}

func testServerClock(t *testing.T, b backend.Backend, skew time.Duration) {
	ctx := context.Background()
	skewed := func() time.Time { return time.Now().Add(skew) }

	// A claim with a 10 s lease, made by a store whose clock is off.
	req := request("live")
	claim, won, err := b.Claim(ctx, req, skewed(), 10*time.Second)
	require.NoError(t, err)
	require.True(t, won)
	assert.WithinDuration(t, time.Now(), claim.CreatedAt, 5*time.Second, "the claim time is the server's, not the caller's")
	assert.WithinDuration(t, time.Now().Add(10*time.Second), claim.LeaseUntil, 5*time.Second, "the lease runs on the server's clock")

	// Other stores, skewed too, must see it live.
	got, won, err := b.Claim(ctx, request("live"), skewed(), 10*time.Second)
	require.NoError(t, err)
	assert.False(t, won)
	assert.Equal(t, backend.StatePending, got.State, "a live lease read as lapsed by a skewed caller")
	got, _, err = b.Get(ctx, "live", skewed())
	require.NoError(t, err)
	assert.Equal(t, backend.StatePending, got.State)
	assert.ErrorIs(t, b.Forget(ctx, "live", skewed()), idem.ErrInProgress, "a skewed Forget deleted a live claim")
	require.NoError(t, b.Renew(ctx, "live", req.Token, skewed(), 10*time.Second), "a live lease refused renewal")

	// An outcome remembered for 8 s is not expired for a clock ahead.
	require.NoError(t, b.Complete(ctx, outcome(claim, "v"), skewed(), 8*time.Second))
	got, won, err = b.Claim(ctx, request("live"), skewed(), 10*time.Second)
	require.NoError(t, err)
	assert.False(t, won, "a skewed claim took over a remembered outcome")
	assertOutcome(t, claim, "v", got)
	assert.WithinDuration(t, time.Now().Add(8*time.Second), got.ExpiresAt, 5*time.Second, "the expiry is the server's")
	n, err := b.Sweep(ctx, skewed(), 100)
	require.NoError(t, err)
	assert.Zero(t, n, "a skewed Sweep deleted a live outcome")
	_, ok, err := b.Get(ctx, "live", skewed())
	require.NoError(t, err)
	assert.True(t, ok)

	// And a short TTL expires by the server's clock, for a clock behind too.
	claimAndComplete(t, b, "short", "v", shortTTL)
	eventually(t, func() bool {
		_, won, err := b.Claim(ctx, request("short"), skewed(), lease)
		require.NoError(t, err)
		return won
	}, "an expired outcome gives way, whatever the caller's clock")
}
