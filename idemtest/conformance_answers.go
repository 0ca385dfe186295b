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

// What a backend answers is what a Store decides by: a malformed answer
// (a won claim without the caller's token, a standing record without one)
// would be taken for a claim or a replay that never was.

// A tester is what assertWellFormed reports to: a *testing.T, or a
// recorder in the test that checks the check.
type tester interface {
	assert.TestingT
	Helper()
}

// assertWellFormed checks that got, Claim's answer to req, is one that
// backend.Backend's Claim doc calls valid.
func assertWellFormed(t tester, req, got backend.Record, won bool) {
	t.Helper()
	assert.Equal(t, req.Key, got.Key, "Key")
	if won {
		assert.Equal(t, req.Token, got.Token, "a won claim holds the caller's Token")
		assert.Equal(t, req.Fingerprint, got.Fingerprint, "a won claim holds the caller's Fingerprint")
		assert.Equal(t, backend.StatePending, got.State, "a won claim is pending")
		return
	}
	assert.NotEmpty(t, got.Token, "a standing record has a Token")
	assert.Contains(t, []backend.RecordState{backend.StatePending, backend.StateCompleted, backend.StateInterrupted}, got.State,
		"a standing record has a valid State, not %v", got.State)
}

// Every answer Claim gives, won or not, is well formed.
func testClaimAnswersWellFormed(t *testing.T, b backend.Backend) {
	ctx := context.Background()
	claim := func(key string) (backend.Record, bool) {
		t.Helper()
		req := request(key)
		req.Fingerprint = idem.Fingerprint{9, 8, 7}
		got, won, err := b.Claim(ctx, req, time.Now(), lease)
		require.NoError(t, err)
		assertWellFormed(t, req, got, won)
		return got, won
	}

	_, won := claim("k")
	require.True(t, won, "a free key is claimed")
	_, won = claim("k")
	assert.False(t, won, "a pending key is not claimed again")

	done := claimAndComplete(t, b, "done", "v", ttl)
	got, won := claim("done")
	assert.False(t, won)
	assert.Equal(t, done.Token, got.Token, "the completed record is answered")

	gone := claimKey(t, b, "gone", shortLease)
	eventually(t, func() bool { rec, _ := get(t, b, "gone"); return rec.State == backend.StateInterrupted }, "the lease lapses")
	got, won = claim("gone")
	assert.False(t, won)
	assert.Equal(t, gone.Token, got.Token, "the interrupted record is answered")
}

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
