package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/seed094d4201/idem/backend"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A completed row without an expiry is none this package writes (Complete
// always sets one): a damaged row, or one another tool wrote. It must read
// as damaged, not as absent. Before, Get's filter on live records compared
// the missing expiry to NULL and left the row out, answering "no record",
// while Claim failed on it (a NULL scanned into a bool): an operator's
// show found nothing where every call of the key failed.
func TestCompletedRowWithoutAnExpiryReadsAsDamaged(t *testing.T) {
	ctx := context.Background()
	pool := testPool(t)
	b, table := testBackend(t, pool)
	_, err := pool.Exec(ctx, `INSERT INTO `+table+` (key, fingerprint, token, state, created_at, expires_at, value)
VALUES ('k', decode(repeat('00', 32), 'hex'), 't', 2, now(), NULL, '\x01')`)
	require.NoError(t, err)

	_, ok, err := b.Get(ctx, "k", time.Now())
	assert.ErrorContains(t, err, "without an expiry", "Get reads the damaged row as damaged")
	assert.False(t, ok)
	_, won, err := b.Claim(ctx, backend.Record{Key: "k", Token: "t2", State: backend.StatePending}, time.Now(), time.Minute)
	assert.ErrorContains(t, err, "without an expiry", "Claim reads the damaged row as damaged")
	assert.False(t, won)
	n, err := b.Sweep(ctx, time.Now(), 10)
	require.NoError(t, err)
	assert.Zero(t, n, "a sweep leaves it for the operator")
	require.NoError(t, b.Forget(ctx, "k", time.Now()), "the operator can forget it")
	_, ok, err = b.Get(ctx, "k", time.Now())
	require.NoError(t, err)
	assert.False(t, ok)
}
