package postgres

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestConformanceSteps(t *testing.T) {
	pool := testPool(t)
	idemtest.RunSteps(t, func(t *testing.T) backend.Stepper {
		b, _ := testBackend(t, pool)
		return b
	})
}

// A table made before steps gets its steps column from New, also under a
// schema-qualified name.
func TestNewAddsStepsColumn(t *testing.T) {
	pool := testPool(t)
	ctx := context.Background()
	var r [6]byte
	_, _ = rand.Read(r[:])
	schema := "idem_test_" + hex.EncodeToString(r[:])
	_, err := pool.Exec(ctx, "CREATE SCHEMA "+schema)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE") })

	current := createSQL(schema+".keys", "keys_sweep")
	old := strings.Replace(current, ",\n    steps       bytea", "", 1)
	require.NotEqual(t, current, old)
	_, err = pool.Exec(ctx, old)
	require.NoError(t, err)

	b, err := New(ctx, pool, Options{Table: schema + ".keys"})
	require.NoError(t, err)
	claim, won, err := b.Claim(ctx, backend.Record{Key: "k", Token: "t"}, time.Now(), time.Hour)
	require.NoError(t, err)
	require.True(t, won)
	require.NoError(t, b.RecordStep(ctx, "k", claim.Token, backend.Step{Name: "s", Value: []byte("v")}, time.Now()))
	rec, _, err := b.Get(ctx, "k", time.Now())
	require.NoError(t, err)
	require.Len(t, rec.Steps, 1)
	assert.Equal(t, "v", string(rec.Steps[0].Value))

	_, err = New(ctx, pool, Options{Table: schema + ".keys"})
	assert.NoError(t, err, "a table that has the column is left as it is")
}

// A step's time is the server's: the caller's now is ignored, as everywhere
// in this backend.
func TestRecordStepAtServerTime(t *testing.T) {
	b, _ := testBackend(t, testPool(t))
	ctx := context.Background()
	claim, _, err := b.Claim(ctx, backend.Record{Key: "k", Token: "t"}, time.Now(), time.Hour)
	require.NoError(t, err)
	require.NoError(t, b.RecordStep(ctx, "k", claim.Token, backend.Step{Name: "s"}, time.Unix(0, 0)))
	rec, _, err := b.Get(ctx, "k", time.Now())
	require.NoError(t, err)
	require.Len(t, rec.Steps, 1)
	assert.WithinDuration(t, time.Now(), rec.Steps[0].At, time.Minute)
}

// A claim that takes over an expired record starts without the steps of the
// operation before it.
func TestTakeOverClearsSteps(t *testing.T) {
	b, _ := testBackend(t, testPool(t))
	ctx := context.Background()
	claim, _, err := b.Claim(ctx, backend.Record{Key: "k", Token: "old"}, time.Now(), time.Hour)
	require.NoError(t, err)
	require.NoError(t, b.RecordStep(ctx, "k", claim.Token, backend.Step{Name: "s"}, time.Now()))
	claim.Value = []byte("v")
	require.NoError(t, b.Complete(ctx, claim, time.Now(), time.Millisecond))
	require.Eventually(t, func() bool { _, ok, _ := b.Get(ctx, "k", time.Now()); return !ok }, 5*time.Second, 5*time.Millisecond)

	rec, won, err := b.Claim(ctx, backend.Record{Key: "k", Token: "new"}, time.Now(), time.Hour)
	require.NoError(t, err)
	require.True(t, won)
	assert.Empty(t, rec.Steps)
	got, _, err := b.Get(ctx, "k", time.Now())
	require.NoError(t, err)
	assert.Empty(t, got.Steps)
}
