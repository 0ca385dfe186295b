package mysql

import (
	"context"
	"testing"
	"time"

	"github.com/seed094d4201/idem/backend"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A conflict that never ends (a trigger that sleeps, then raises a
// deadlock, on every UPDATE), its last attempt cut short by ctx's end
// (each attempt outlasts what is left of ctx): the error says both, the
// conflict that kept the statement retrying and ctx's end, not ctx's end
// alone.
func TestConflictCutShortByCtxKeepsTheConflict(t *testing.T) {
	db := testDB(t)
	b, table := testBackend(t, db)
	ctx := context.Background()
	trigger := table + "_conflict"
	_, err := db.ExecContext(ctx, "CREATE TRIGGER `"+trigger+"` BEFORE UPDATE ON `"+table+"` FOR EACH ROW BEGIN "+
		"DO SLEEP(0.2); SIGNAL SQLSTATE '40001' SET MYSQL_ERRNO = 1213, MESSAGE_TEXT = 'forced deadlock'; END")
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = db.ExecContext(context.Background(), "DROP TRIGGER IF EXISTS `"+trigger+"`") })
	rec := backend.Record{Key: "k", Token: "t", State: backend.StatePending}
	_, won, err := b.Claim(ctx, rec, time.Now(), time.Minute)
	require.NoError(t, err)
	require.True(t, won)

	tctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond) // the second attempt, 200 ms in, is cut at 300
	defer cancel()
	rec.State = backend.StateCompleted
	err = b.Complete(tctx, rec, time.Now(), time.Hour)
	require.Error(t, err)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.True(t, conflicted(err), "the conflict is kept: %v", err)
}
