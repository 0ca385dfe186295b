package mysql

import (
	"context"
	"testing"
	"time"

	"github.com/seed094d4201/idem/backend"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A Sweep whose COMMIT never reaches the server deleted nothing, and says
// so: it returned the count of the DELETE its rolled-back transaction had
// run, which a Store's Sweep and its Observer reported as swept.
func TestSweepWhoseCommitIsLostCountsNothing(t *testing.T) {
	direct := testDB(t)
	b, table := testBackend(t, direct)
	ctx := context.Background()
	rec := backend.Record{Key: "k", Token: "t", State: backend.StatePending}
	_, claimed, err := b.Claim(ctx, rec, time.Now(), time.Minute)
	require.NoError(t, err)
	require.True(t, claimed)
	rec.State = backend.StateCompleted
	require.NoError(t, b.Complete(ctx, rec, time.Now(), time.Millisecond))
	for { // the server's clock passes the record's expiry
		_, found, err := b.Get(ctx, "k", time.Now())
		require.NoError(t, err)
		if !found {
			break
		}
	}

	db, proxy := proxiedDB(t)
	through, err := New(ctx, db, Options{Table: table, NoMigrate: true})
	require.NoError(t, err)
	// COM_QUERY (3) then COMMIT: the isolation level's statement, READ
	// COMMITTED, holds the word too.
	proxy.DropRequest([]byte("\x03COMMIT"))
	n, err := through.Sweep(ctx, time.Now(), 100)
	select {
	case <-proxy.Fired(): // the proxy closes the connection, then marks the fault fired
	case <-time.After(10 * time.Second):
		t.Fatal("the COMMIT was not dropped: the test proved nothing")
	}
	require.Error(t, err)
	assert.Zero(t, n, "a sweep that did not commit counted its deletions")
	var left int
	require.NoError(t, direct.QueryRowContext(ctx, "SELECT COUNT(*) FROM `"+table+"`").Scan(&left))
	assert.Equal(t, 1, left, "the record was deleted after all")
}
