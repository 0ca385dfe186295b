package idemtest

import (
	"context"
	"testing"
	"time"

	"github.com/seed094d4201/idem/backend"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// testReopenInterruptsPending: a backend that proves its dead owners dead
// when it reopens (Harness.ReopenProvesDeath) finds every record left
// pending, its lease live or none, interrupted with a zero LeaseUntil, so
// that a Store acts on it at once; the claim keeps its token,
// fingerprint, creation time and steps, its token may no longer renew it
// or add a step but may still settle or resume it, and a completed record
// is kept as it was.
func testReopenInterruptsPending(t *testing.T, h Harness) {
	b := h.Backend(t)
	if b == nil {
		t.Skip("a memory-only store has nothing to reopen")
	}
	ctx := context.Background()
	live := claimKey(t, b, "live", lease)
	unleased := claimKey(t, b, "unleased", 0)
	done := claimAndComplete(t, b, "done", "v", ttl)
	st, steps := b.(backend.Stepper)
	if steps {
		require.NoError(t, st.RecordStep(ctx, "live", live.Token, backend.Step{Name: "charge", Value: []byte{0, 1}}, time.Now()))
	}

	b = h.Reopen(t, b)
	st, steps = b.(backend.Stepper)
	for _, claim := range []backend.Record{live, unleased} {
		rec, ok := get(t, b, claim.Key)
		require.True(t, ok, "%s: a pending record vanished on reopen", claim.Key)
		assert.Equal(t, backend.StateInterrupted, rec.State, "%s: a record left pending is interrupted on reopen", claim.Key)
		assert.True(t, rec.LeaseUntil.IsZero(), "%s: its owner is proven dead, no lease is left to judge: %v", claim.Key, rec.LeaseUntil)
		assert.Equal(t, claim.Token, rec.Token, "%s: Token", claim.Key)
		assert.Equal(t, claim.Fingerprint, rec.Fingerprint, "%s: Fingerprint", claim.Key)
		assert.Equal(t, claim.CreatedAt.UnixMilli(), rec.CreatedAt.UnixMilli(), "%s: CreatedAt", claim.Key)
		got, won, err := b.Claim(ctx, request(claim.Key), time.Now(), lease)
		require.NoError(t, err)
		assert.False(t, won, "%s: a claim took an interrupted record over", claim.Key)
		assert.Equal(t, claim.Token, got.Token, "%s: a claim answers with the interrupted record", claim.Key)
	}
	rec, _ := get(t, b, "done")
	assertOutcome(t, done, "v", rec)
	// Its owner is dead: nothing may renew it or add to it any more.
	assert.ErrorIs(t, b.Renew(ctx, "unleased", unleased.Token, time.Now(), lease), backend.ErrNotOwner, "Renew of a claim whose owner is proven dead")
	if steps {
		assert.ErrorIs(t, st.RecordStep(ctx, "unleased", unleased.Token, backend.Step{Name: "late"}, time.Now()), backend.ErrNotOwner, "RecordStep of a claim whose owner is proven dead")
	}

	if steps {
		rec, _ := get(t, b, "live")
		require.Len(t, rec.Steps, 1, "the steps survive the reopen")
		assert.Equal(t, []byte{0, 1}, rec.Steps[0].Value)
		resumed, err := st.Resume(ctx, "live", live.Token, token(), time.Now(), lease)
		require.NoError(t, err, "the interrupted claim is resumable")
		assert.Len(t, resumed.Steps, 1)
	} else {
		require.NoError(t, b.Release(ctx, "live", live.Token), "the interrupted claim is settleable by its token")
	}
	require.NoError(t, b.Release(ctx, "unleased", unleased.Token), "the interrupted claim is settleable by its token")
}
