package postgres

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// partitionedSQL is the package doc's partitioned layout for table: by
// range of key, for keys that begin with their day, a partition a day and
// a default one.
func partitionedSQL(table string) string {
	return `CREATE TABLE ` + table + ` (
    key text PRIMARY KEY, fingerprint bytea NOT NULL, token text NOT NULL, state smallint NOT NULL,
    created_at timestamptz NOT NULL, expires_at timestamptz, lease_until timestamptz, value bytea,
    failed boolean NOT NULL DEFAULT false, err_msg text NOT NULL DEFAULT '', steps bytea, sweep_at timestamptz
) PARTITION BY RANGE (key);
CREATE INDEX ON ` + table + ` (sweep_at);
CREATE TABLE ` + table + `_20261201 PARTITION OF ` + table + ` FOR VALUES FROM ('2026-12-01') TO ('2026-12-02') WITH (fillfactor = 90);
CREATE TABLE ` + table + `_20261202 PARTITION OF ` + table + ` FOR VALUES FROM ('2026-12-02') TO ('2026-12-03') WITH (fillfactor = 90);
CREATE TABLE ` + table + `_default PARTITION OF ` + table + ` DEFAULT WITH (fillfactor = 90);`
}

// partitioned makes a partitioned table of its own, dropped when the test
// ends, and a Backend over it (NoMigrate: New's migration is for a plain
// table).
func partitioned(t *testing.T, pool *pgxpool.Pool) (*Backend, string) {
	t.Helper()
	ctx := context.Background()
	var r [4]byte
	_, _ = rand.Read(r[:])
	table := "idem_part_" + hex.EncodeToString(r[:])
	_, err := pool.Exec(ctx, partitionedSQL(table))
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `DROP TABLE IF EXISTS `+table) })
	b, err := New(ctx, pool, Options{Table: table, NoMigrate: true})
	require.NoError(t, err)
	return b, table
}

// The partitioned layout keeps every promise of the plain table: the
// conformance suite and the shared-backend suite pass over it.
func TestPartitionedLayoutConforms(t *testing.T) {
	pool := testPool(t)
	idemtest.RunShared(t, func(t *testing.T) backend.Backend {
		b, _ := partitioned(t, pool)
		return b
	})
}

// A day's partition dropped whole takes that day's records with it, and
// nothing else: its keys run afresh, as after their TTL, and the other
// day's keys still replay. Claims go on while the partition is detached.
func TestDroppedPartitionForgetsItsDay(t *testing.T) {
	pool := testPool(t)
	ctx := context.Background()
	b, table := partitioned(t, pool)
	store := idem.New[int](idem.Options{Backend: b})
	defer func() { store.Close() }()
	runs := map[string]int{}
	run := func(key string) int {
		v, err := store.RunOnce(ctx, key, nil, func(context.Context) (int, error) {
			runs[key]++
			return runs[key], nil
		})
		require.NoError(t, err, key)
		return v
	}
	old, kept, other := "2026-12-01/order-1", "2026-12-02/order-2", "order-3"
	for _, key := range []string{old, kept, other} {
		assert.Equal(t, 1, run(key), key)
	}
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+table+`_20261201`).Scan(&n))
	assert.Equal(t, 1, n, "the day's partition holds its key")

	_, err := pool.Exec(ctx, `ALTER TABLE `+table+` DETACH PARTITION `+table+`_20261201`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `DROP TABLE `+table+`_20261201`)
	require.NoError(t, err)

	store.Close() // a new process: nothing in memory
	store = idem.New[int](idem.Options{Backend: b})
	assert.Equal(t, 2, run(old), "a key of the dropped day runs afresh")
	assert.Equal(t, 1, run(kept), "a key of a kept day replays")
	assert.Equal(t, 1, run(other), "a key of the default partition replays")
	rec, ok, err := b.Get(ctx, old, time.Now())
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, backend.StateCompleted, rec.State)
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+table+`_default WHERE key = $1`, old).Scan(&n))
	assert.Equal(t, 1, n, "its new record went to the default partition")
}
