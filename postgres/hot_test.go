package postgres

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/seed094d4201/idem/backend"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// hotCompletes claims and completes n keys with b's own statements, in one
// transaction on one connection, and returns how many of the Completes
// PostgreSQL made HOT updates: pg_stat_get_xact_tuples_hot_updated counts
// the session's own not yet reported (this transaction's, and maybe some
// before it), so no statistics collector is waited for.
func hotCompletes(t *testing.T, pool *pgxpool.Pool, b *Backend, table string, n int) int64 {
	t.Helper()
	ctx := context.Background()
	var before, hot int64
	value := []byte(strings.Repeat("v", 300))
	const count = `SELECT pg_stat_get_xact_tuples_hot_updated($1::text::regclass)`
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, count, table).Scan(&before); err != nil {
			return err
		}
		for i := range n {
			key, token := fmt.Sprint("hot-", i), fmt.Sprint("tok-", i)
			if _, err := tx.Exec(ctx, b.q.claim, key, []byte("fp"), token, micros(time.Minute), micros(time.Hour)); err != nil {
				return err
			}
			tag, err := tx.Exec(ctx, b.q.complete, key, token, micros(time.Hour), value, false, "")
			if err != nil {
				return err
			}
			if tag.RowsAffected() != 1 {
				return fmt.Errorf("complete of %s changed %d rows", key, tag.RowsAffected())
			}
		}
		return tx.QueryRow(ctx, count, table).Scan(&hot)
	}))
	return hot - before
}

// A Complete is a HOT update: no index holds a column it writes, and the
// table's fillfactor leaves room on the page. Every one left a dead index
// entry and a dead row for vacuum before (0 of 600,713 were HOT).
func TestCompleteIsAHOTUpdate(t *testing.T) {
	pool := testPool(t)
	b, table := testBackend(t, pool)
	const n = 200
	assert.Equal(t, int64(n), hotCompletes(t, pool, b, table, n), "HOT Completes of %d", n)
}

// legacySQL is the table as versions before sweep_at made it: the sweep's
// index on expires_at, for completed rows, and no fillfactor.
func legacySQL(table, index string) string {
	return `CREATE TABLE ` + table + ` (
    key text PRIMARY KEY, fingerprint bytea NOT NULL, token text NOT NULL, state smallint NOT NULL,
    created_at timestamptz NOT NULL, expires_at timestamptz, lease_until timestamptz, value bytea,
    failed boolean NOT NULL DEFAULT false, err_msg text NOT NULL DEFAULT '', steps bytea
) WITH (` + autovacuum + `);
CREATE INDEX ` + index + ` ON ` + table + ` (expires_at) WHERE state = 2;`
}

// New brings a table made before sweep_at to the layout: the column is
// added (and left unset: no UPDATE of every row under the ALTER's lock),
// the sweep's index made, the old index dropped and the fillfactor set;
// then the first sweep finds the rows it had, removes the expired one and
// gives the others their sweep_at, and Completes are HOT.
func TestNewUpgradesAnOlderTable(t *testing.T) {
	pool := testPool(t)
	ctx := context.Background()
	var r [4]byte
	_, _ = rand.Read(r[:])
	table := "idem_legacy_" + hex.EncodeToString(r[:])
	t.Cleanup(func() { _, _ = pool.Exec(ctx, `DROP TABLE IF EXISTS `+table) })
	_, err := pool.Exec(ctx, legacySQL(table, table+"_expiry"))
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO `+table+` (key, fingerprint, token, state, created_at, expires_at, lease_until) VALUES
    ('expired', decode(repeat('00', 32), 'hex'), 't1', 2, now() - interval '2 hours', now() - interval '1 hour', NULL),
    ('live', decode(repeat('00', 32), 'hex'), 't2', 2, now(), now() + interval '1 hour', NULL),
    ('pending', decode(repeat('00', 32), 'hex'), 't3', 1, now() - interval '2 hours', NULL, now() + interval '1 hour')`)
	require.NoError(t, err)

	b, err := New(ctx, pool, Options{Table: table})
	require.NoError(t, err)

	var indexes []string
	rows, err := pool.Query(ctx, `SELECT indexrelid::regclass::text FROM pg_index WHERE indrelid = $1::text::regclass AND NOT indisprimary`, table)
	require.NoError(t, err)
	indexes, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	assert.Equal(t, []string{table + "_sweep"}, indexes)
	var opts string
	require.NoError(t, pool.QueryRow(ctx, `SELECT array_to_string(reloptions, ',') FROM pg_class WHERE oid = $1::text::regclass`, table).Scan(&opts))
	assert.Contains(t, opts, "fillfactor=90")
	unset := func() (n int) {
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+table+` WHERE sweep_at IS NULL`).Scan(&n))
		return n
	}
	assert.Equal(t, 3, unset(), "New wrote the rows")

	n, err := b.Sweep(ctx, time.Now(), 10)
	require.NoError(t, err)
	assert.Equal(t, 1, n, "the expired row swept")
	assert.Zero(t, unset(), "rows the sweep left without sweep_at")
	var aimed bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT sweep_at = expires_at FROM `+table+` WHERE key = 'live'`).Scan(&aimed))
	assert.True(t, aimed, "the live row is next looked at when it expires")
	for key, want := range map[string]bool{"expired": false, "live": true} {
		_, ok, err := b.Get(ctx, key, time.Now())
		require.NoError(t, err)
		assert.Equal(t, want, ok, key)
	}
	rec, ok, err := b.Get(ctx, "pending", time.Now())
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, backend.StatePending, rec.State, "the pending row stays")

	_, err = New(ctx, pool, Options{Table: table})
	require.NoError(t, err, "again: nothing left to change")
	assert.Equal(t, int64(20), hotCompletes(t, pool, b, table, 20))
}

// A Store's Completes all send one TTL, which the Backend learns, so a
// claim's sweep_at is its instant plus that TTL: a sweep looks at no
// record before it may have expired, and finds each once it has.
func TestSweepAtIsTheClaimPlusTheTTL(t *testing.T) {
	pool := testPool(t)
	ctx := context.Background()
	b, table := testBackend(t, pool)
	err := b.Complete(ctx, backend.Record{Key: "none", Token: "x"}, time.Now(), time.Hour) // learns the TTL; no row changes
	require.ErrorIs(t, err, backend.ErrNotOwner)
	claim, won, err := b.Claim(ctx, backend.Record{Key: "k", Token: "t"}, time.Now(), time.Minute)
	require.NoError(t, err)
	require.True(t, won)
	var gap time.Duration
	var micros int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT (extract(epoch FROM sweep_at - created_at) * 1e6)::bigint FROM `+table+` WHERE key = 'k'`).Scan(&micros))
	gap = time.Duration(micros) * time.Microsecond
	assert.InDelta(t, float64(time.Hour), float64(gap), float64(time.Second), "sweep_at - created_at")
	require.NoError(t, b.Complete(ctx, backend.Record{Key: "k", Token: claim.Token}, time.Now(), time.Hour))
	var expires, sweepAt time.Time
	require.NoError(t, pool.QueryRow(ctx, `SELECT expires_at, sweep_at FROM `+table+` WHERE key = 'k'`).Scan(&expires, &sweepAt))
	assert.False(t, sweepAt.After(expires), "sweep_at %v past the expiry %v: a sweep would keep the record too long", sweepAt, expires)
}
