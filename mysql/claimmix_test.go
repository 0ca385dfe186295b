package mysql

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/seed094d4201/idem/backend"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A Backend claims new keys with the insert alone, switches to INSERT ...
// RETURNING once most claims meet a record, and back once most are new.
func TestClaimMixFollowsWhatClaimsMeet(t *testing.T) {
	var m claimMix
	require.False(t, m.returning(), "new keys first")
	n := 0
	for ; !m.returning(); n++ {
		m.note(true)
	}
	assert.LessOrEqual(t, n, 8, "a run of replays switches within a few claims")
	for range 100 {
		m.note(true)
	}
	assert.True(t, m.returning())
	for range 3 {
		m.note(false)
	}
	assert.True(t, m.returning(), "a few new keys among replays do not switch")
	for range 30 {
		m.note(false)
	}
	assert.False(t, m.returning(), "a run of new keys switches back")
	for i := range 300 {
		m.note(i%4 == 0) // a quarter meet a record
	}
	assert.False(t, m.returning(), "a quarter of replays cost less with the insert alone")
}

// A claim the insert alone won answers the record as the server stored
// it, instants to the microsecond, as a read of it does; with no lease, no
// lease instant.
func TestInsertAloneAnswersTheStoredClaim(t *testing.T) {
	db := testDB(t)
	for _, shape := range shapes {
		t.Run(shape.name, func(t *testing.T) {
			b, _ := testBackend(t, db)
			shape.apply(b)
			ctx := context.Background()
			for i, lease := range []time.Duration{time.Minute, 1500 * time.Nanosecond, 0} {
				rec := backend.Record{Key: fmt.Sprintf("k%d", i), Token: "t", Fingerprint: [32]byte{1, 2, 3}}
				got, won, err := b.Claim(ctx, rec, time.Time{}, lease)
				require.NoError(t, err)
				require.True(t, won)
				stored, ok, err := b.Get(ctx, rec.Key, time.Time{})
				require.NoError(t, err)
				require.True(t, ok)
				if lease > 0 && lease < time.Millisecond {
					// Lapsed by the read: the read says interrupted.
					stored.State = backend.StatePending
				}
				assert.Equal(t, stored, got, "lease %v", lease)
				assert.Equal(t, backend.StatePending, got.State)
				assert.Equal(t, lease == 0, got.LeaseUntil.IsZero())
				if lease > 0 {
					assert.Equal(t, micros(lease), got.LeaseUntil.Sub(got.CreatedAt).Microseconds())
				}
			}
		})
	}
}

// An unpinned Backend that meets records claims with RETURNING, and its
// claims answer the same either way.
func TestClaimsSwitchToReturningOnReplays(t *testing.T) {
	db := testDB(t)
	b, _ := testBackend(t, db)
	if !b.returning {
		t.Skip("the server has no INSERT ... RETURNING")
	}
	ctx := context.Background()
	rec := backend.Record{Key: "k", Token: "t"}
	_, won, err := b.Claim(ctx, rec, time.Time{}, time.Minute)
	require.NoError(t, err)
	require.True(t, won)
	rec.Value = []byte("v")
	require.NoError(t, b.Complete(ctx, rec, time.Time{}, time.Minute))
	for i := range 20 {
		got, won, err := b.Claim(ctx, backend.Record{Key: "k", Token: fmt.Sprint("other", i)}, time.Time{}, time.Minute)
		require.NoError(t, err)
		require.False(t, won)
		assert.Equal(t, backend.StateCompleted, got.State)
		assert.Equal(t, "v", string(got.Value))
	}
	assert.True(t, b.mix.returning(), "replays: RETURNING")
	for i := range 40 {
		_, won, err := b.Claim(ctx, backend.Record{Key: fmt.Sprint("new", i), Token: "t"}, time.Time{}, time.Minute)
		require.NoError(t, err)
		require.True(t, won)
	}
	assert.False(t, b.mix.returning(), "new keys: the insert alone")
}
