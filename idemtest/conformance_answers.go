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

// A record keeps the fingerprint it was claimed with: Complete records the
// outcome only (backend.Backend's Complete doc), whatever Fingerprint the
// record it is given holds.
func testCompleteKeepsFingerprint(t *testing.T, b backend.Backend) {
	ctx := context.Background()
	claim := claimKey(t, b, "k", lease)
	done := outcome(claim, "v")
	done.Fingerprint = idem.Fingerprint{0xde, 0xad}
	require.NotEqual(t, claim.Fingerprint, done.Fingerprint)
	require.NoError(t, b.Complete(ctx, done, time.Now(), ttl))

	got, ok := get(t, b, "k")
	require.True(t, ok)
	assertOutcome(t, claim, "v", got)
	replay, won, err := b.Claim(ctx, request("k"), time.Now(), lease)
	require.NoError(t, err)
	assert.False(t, won)
	assert.Equal(t, claim.Fingerprint, replay.Fingerprint, "Claim answers the claim's fingerprint")
}
