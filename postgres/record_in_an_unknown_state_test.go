package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A row in a state this version does not know (a later version's, or a
// damaged one) reads as damaged, never as a record to act on. Before, Get
// returned it as it was, and a Store's Resolve, finding it neither pending
// nor completed, took it for interrupted and wrote the operator's outcome
// over it.
func TestRowInAnUnknownStateReadsAsDamaged(t *testing.T) {
	ctx := context.Background()
	pool := testPool(t)
	b, table := testBackend(t, pool)
	_, err := pool.Exec(ctx, `INSERT INTO `+table+` (key, fingerprint, token, state, created_at, value)
VALUES ('k', decode(repeat('00', 32), 'hex'), 't', 4, now(), '\x01')`)
	require.NoError(t, err)

	_, _, err = b.Get(ctx, "k", time.Now())
	assert.ErrorContains(t, err, "unknown state 4", "Get reads the row as damaged")
	_, won, err := b.Claim(ctx, backend.Record{Key: "k", Token: "t2", State: backend.StatePending}, time.Now(), time.Minute)
	assert.ErrorContains(t, err, "unknown state 4", "Claim reads the row as damaged")
	assert.False(t, won)
	s := idem.New[string](idem.Options{Backend: b})
	t.Cleanup(func() { _ = s.Close() })
	assert.Error(t, s.Resolve(ctx, "k", "resolved", nil))
	var state int
	require.NoError(t, pool.QueryRow(ctx, `SELECT state FROM `+table+` WHERE key = 'k'`).Scan(&state))
	assert.Equal(t, 4, state, "the row is left as it was")
}
