package sqlite

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/seed094d4201/idem/backend"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A completed row without an expiry is none this package writes (Complete
// always sets one): a damaged row, or one another tool wrote. It must read
// as damaged, not as absent. Before, Get took its missing expiry for the
// zero instant, long past, and answered "no record", while Claim failed on
// it ("an expired record could not be taken over"): an operator's show
// found nothing where every call of the key failed.
func TestCompletedRowWithoutAnExpiryReadsAsDamaged(t *testing.T) {
	db, err := Open(filepath.Join(t.TempDir(), "idem.db"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	ctx := context.Background()
	b, err := New(ctx, db, Options{})
	require.NoError(t, err)
	_, err = db.ExecContext(ctx, `INSERT INTO idem_keys (key, fingerprint, token, state, created_at, expires_at, value)
VALUES ('k', zeroblob(32), 't', 2, 1, NULL, x'01')`)
	require.NoError(t, err)

	_, ok, err := b.Get(ctx, "k", time.Now())
	assert.Error(t, err, "Get reads the damaged row as damaged")
	assert.False(t, ok)
	_, won, err := b.Claim(ctx, backend.Record{Key: "k", Token: "t2", State: backend.StatePending}, time.Now(), time.Minute)
	assert.Error(t, err, "Claim reads the damaged row as damaged")
	assert.False(t, won)
	n, err := b.Sweep(ctx, time.Now(), 10)
	require.NoError(t, err)
	assert.Zero(t, n, "a sweep leaves it for the operator")
	require.NoError(t, b.Forget(ctx, "k", time.Now()), "the operator can forget it")
	_, ok, err = b.Get(ctx, "k", time.Now())
	require.NoError(t, err)
	assert.False(t, ok)
}
