package postgres

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The sweep's index is on sweep_at, which the claim sets from the TTL the
// Backend has learned. These tests meet it with what it did not assume:
// another TTL, a claim never completed, a row an earlier version wrote.

// untilServerPassed waits until the server's now() has passed the
// instant the query returns for the row k: waiting on the database's clock,
// which orders no goroutine.
func untilServerPassed(t *testing.T, b *Backend, table, column, key string) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var passed bool
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT `+column+` <= now() FROM `+table+` WHERE key = $1`, key).Scan(&passed))
		if passed {
			return
		}
		require.True(t, time.Now().Before(deadline), "the server's clock never passed %s of %s", column, key)
		time.Sleep(5 * time.Millisecond)
	}
}

func claimed(t *testing.T, b *Backend, key string, lease time.Duration) backend.Record {
	t.Helper()
	rec, won, err := b.Claim(context.Background(), backend.Record{Key: key, Token: key + "-token"}, time.Now(), lease)
	require.NoError(t, err)
	require.True(t, won)
	return rec
}

// Two Stores with different TTLs on one Backend: a record completed with
// the shorter TTL after the Backend learned the longer is swept once it
// expires, not when the longer TTL would have ended (helper-34: it stayed
// for the longest TTL).
func TestShorterTTLIsSweptWhenItExpires(t *testing.T) {
	pool := testPool(t)
	ctx := context.Background()
	b, table := testBackend(t, pool)
	long := claimed(t, b, "long", time.Minute)
	require.NoError(t, b.Complete(ctx, long, time.Now(), time.Hour))
	short := claimed(t, b, "short", time.Minute) // sweep_at an hour on
	require.NoError(t, b.Complete(ctx, short, time.Now(), 20*time.Millisecond))
	untilServerPassed(t, b, table, "expires_at", "short")
	n, err := b.Sweep(ctx, time.Now(), 10)
	require.NoError(t, err)
	assert.Equal(t, 1, n, "the expired short-TTL record swept")
	_, ok, err := b.Get(ctx, "long", time.Now())
	require.NoError(t, err)
	assert.True(t, ok, "the long-TTL record stays")
}

// A claim never completed (its process died: an interrupted key, which
// never expires) and a record of a longer TTL than the claim assumed are
// found by sweep_at early. The sweep leaves them where they are and moves
// them along the index, so that the next sweeps do not read them again:
// the record to its expiry, the pending claim a TTL on.
func TestSweepMovesRowsItFindsEarly(t *testing.T) {
	pool := testPool(t)
	ctx := context.Background()
	b, table := testBackend(t, pool)
	const ttl = 50 * time.Millisecond
	first := claimed(t, b, "first", time.Minute)
	require.NoError(t, b.Complete(ctx, first, time.Now(), ttl)) // learns ttl
	claimed(t, b, "stuck", time.Hour)                           // never completed
	longer := claimed(t, b, "longer", time.Minute)
	require.NoError(t, b.Complete(ctx, longer, time.Now(), time.Hour))
	untilServerPassed(t, b, table, "sweep_at", "stuck")
	untilServerPassed(t, b, table, "sweep_at", "longer")

	n, err := b.Sweep(ctx, time.Now(), 10)
	require.NoError(t, err)
	assert.Equal(t, 1, n, "only the first record had expired")
	var stuckAhead, longerAtExpiry bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT sweep_at > now() FROM `+table+` WHERE key = 'stuck'`).Scan(&stuckAhead))
	require.NoError(t, pool.QueryRow(ctx, `SELECT sweep_at = expires_at FROM `+table+` WHERE key = 'longer'`).Scan(&longerAtExpiry))
	assert.True(t, stuckAhead, "the pending claim is looked at again a TTL on")
	assert.True(t, longerAtExpiry, "the longer record is looked at again when it expires")
	for _, key := range []string{"stuck", "longer"} {
		_, ok, err := b.Get(ctx, key, time.Now())
		require.NoError(t, err)
		assert.True(t, ok, key)
	}
}

// A replica of the version before sweep_at, still running during a
// rollout, claims and completes without it. A sweep of this version
// finds those rows all the same (helper-34: they were never swept).
func TestSweepFindsRowsOfAnEarlierVersion(t *testing.T) {
	pool := testPool(t)
	ctx := context.Background()
	b, table := testBackend(t, pool)
	_, err := pool.Exec(ctx, `INSERT INTO `+table+` (key, fingerprint, token, state, created_at, expires_at) VALUES
    ('old-expired', decode(repeat('00', 32), 'hex'), 't1', 2, now() - interval '2 hours', now() - interval '1 hour'),
    ('old-live', decode(repeat('00', 32), 'hex'), 't2', 2, now(), now() + interval '1 hour')`)
	require.NoError(t, err)
	n, err := b.Sweep(ctx, time.Now(), 10)
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	_, ok, err := b.Get(ctx, "old-live", time.Now())
	require.NoError(t, err)
	assert.True(t, ok)
}

// Opened with NoMigrate, a table of an earlier layout fails the claim,
// which writes sweep_at; the error says what to do.
func TestNoMigrateOnAnOlderTableSaysWhatToDo(t *testing.T) {
	pool := testPool(t)
	ctx := context.Background()
	var r [4]byte
	_, _ = rand.Read(r[:])
	table := "idem_older_" + hex.EncodeToString(r[:])
	t.Cleanup(func() { _, _ = pool.Exec(ctx, `DROP TABLE IF EXISTS `+table) })
	_, err := pool.Exec(ctx, legacySQL(table, table+"_expiry"))
	require.NoError(t, err)
	b, err := New(ctx, pool, Options{Table: table, NoMigrate: true})
	require.NoError(t, err)
	s := idem.New[int](idem.Options{Backend: b})
	defer s.Close()
	_, err = s.RunOnce(ctx, "k", nil, func(context.Context) (int, error) { return 1, nil })
	require.Error(t, err)
	assert.Contains(t, err.Error(), "sweep_at")
	assert.Contains(t, err.Error(), "schema.sql")
}

// A replica that starts while the table is busy takes no lock that
// blocks its writes: every step of the migration is asked of the catalog
// first (helper-34: CREATE INDEX IF NOT EXISTS took its SHARE lock at every
// start). A writer's ROW EXCLUSIVE lock is held while New runs.
func TestNewOnABusyTableBlocksNoWriter(t *testing.T) {
	pool := testPool(t)
	ctx := context.Background()
	_, table := testBackend(t, pool)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `LOCK TABLE `+table+` IN ROW EXCLUSIVE MODE`)
	require.NoError(t, err)
	nctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err = New(nctx, pool, Options{Table: table})
	require.NoError(t, err, "New waited for a writer's lock")
}
