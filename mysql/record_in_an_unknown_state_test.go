package mysql

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
	db := testDB(t)
	b, table := testBackend(t, db)
	_, err := db.ExecContext(ctx, `INSERT INTO `+table+" (`key`, fingerprint, token, state, created_at, value, failed, err_msg)"+`
VALUES ('k', REPEAT(x'00', 32), 't', 4, UTC_TIMESTAMP(6), x'01', FALSE, x'')`)
	require.NoError(t, err)

	_, _, err = b.Get(ctx, "k", time.Now())
	assert.ErrorContains(t, err, "unknown state 4", "Get reads the row as damaged")
	for _, sh := range shapes {
		sh.apply(b)
		_, won, err := b.Claim(ctx, backend.Record{Key: "k", Token: "t2", State: backend.StatePending}, time.Now(), time.Minute)
		assert.ErrorContains(t, err, "unknown state 4", "Claim (%s) reads the row as damaged", sh.name)
		assert.False(t, won)
	}
	s := idem.New[string](idem.Options{Backend: b})
	t.Cleanup(func() { _ = s.Close() })
	assert.Error(t, s.Resolve(ctx, "k", "resolved", nil))
	var state int
	require.NoError(t, db.QueryRowContext(ctx, `SELECT state FROM `+table+" WHERE `key` = 'k'").Scan(&state))
	assert.Equal(t, 4, state, "the row is left as it was")
}
