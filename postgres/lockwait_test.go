package postgres

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// New upgrading an old table does not queue its ALTER behind a long
// transaction on the table (an old replica's RunOnceTx), with every query
// on the table queued behind the ALTER: each try gives way after a second,
// and New goes on once the transaction ends.
func TestUpgradeGivesWayToALongTransaction(t *testing.T) {
	pool := testPool(t)
	ctx := context.Background()
	var r [4]byte
	_, _ = rand.Read(r[:])
	table := "idem_lockq_" + hex.EncodeToString(r[:])
	t.Cleanup(func() { _, _ = pool.Exec(ctx, `DROP TABLE IF EXISTS `+table) })
	_, err := pool.Exec(ctx, legacySQL(table, table+"_expiry"))
	require.NoError(t, err)
	tx, err := pool.Begin(ctx) // an old replica's RunOnceTx, its fn running
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `INSERT INTO `+table+` (key, fingerprint, token, state, created_at) VALUES ('tx', '\x00', 't', 1, now())`)
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() {
		nctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		_, err := New(nctx, pool, Options{Table: table})
		done <- err
	}()
	// Once New's ALTER waits for the lock, reads go on: at most a lock
	// wait behind a try.
	deadline := time.Now().Add(10 * time.Second)
	for {
		var waiting bool
		require.NoError(t, pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
    WHERE wait_event_type = 'Lock' AND query LIKE 'ALTER TABLE%' AND query LIKE '%'||$1||'%')`, table).Scan(&waiting))
		if waiting {
			break
		}
		require.True(t, time.Now().Before(deadline), "New's ALTER never waited for the lock")
		time.Sleep(10 * time.Millisecond) // the server's progress
	}
	for range 3 {
		rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		var n int
		err := pool.QueryRow(rctx, `SELECT count(*) FROM `+table).Scan(&n)
		cancel()
		assert.NoError(t, err, "a plain read waited behind New's queued lock")
	}
	require.NoError(t, tx.Commit(ctx))
	require.NoError(t, <-done, "New, once the transaction ended")
}
