package bolt

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/seed094d4201/idem/backend"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	bbolt "go.etcd.io/bbolt"
)

// The package doc's compaction (bbolt's compact command, which is
// bbolt.Compact over a new file) gives back the pages a sweep freed and
// keeps every record: the copy opens, passes the whole check, and answers
// as the original did.
func TestCompactedCopyKeepsEveryRecord(t *testing.T) {
	dir := t.TempDir()
	path, copyPath := filepath.Join(dir, "idem.db"), filepath.Join(dir, "idem.db.compact")
	b, err := Open(path, &Options{noSync: true})
	require.NoError(t, err)
	ctx := context.Background()
	now := time.Now()
	value := make([]byte, 500)
	for i := range 4000 {
		rec := backend.Record{Key: fmt.Sprintf("key-%04d", i), Token: "t", State: backend.StatePending}
		_, _, err := b.Claim(ctx, rec, now, 0)
		require.NoError(t, err)
		rec.Value = value
		ttl := time.Hour
		if i%4 != 0 {
			ttl = time.Millisecond // three in four expire, and are swept
		}
		require.NoError(t, b.Complete(ctx, rec, now, ttl))
	}
	swept, err := b.Sweep(ctx, now.Add(time.Minute), 10_000)
	require.NoError(t, err)
	require.Equal(t, 3000, swept)
	require.NoError(t, b.Close())

	src, err := bbolt.Open(path, 0o600, &bbolt.Options{ReadOnly: true})
	require.NoError(t, err)
	dst, err := bbolt.Open(copyPath, 0o600, nil)
	require.NoError(t, err)
	require.NoError(t, bbolt.Compact(dst, src, 64<<20))
	require.NoError(t, dst.Close())
	require.NoError(t, src.Close())
	before, err := os.Stat(path)
	require.NoError(t, err)
	after, err := os.Stat(copyPath)
	require.NoError(t, err)
	assert.Less(t, after.Size(), before.Size()/2, "compaction gave back the swept pages")
	t.Logf("file %d KB, compacted %d KB", before.Size()>>10, after.Size()>>10)

	require.NoError(t, os.Rename(copyPath, path))
	c, err := Open(path, nil) // no mark of its own: checked in full
	require.NoError(t, err)
	defer c.Close()
	for i := range 4000 {
		key := fmt.Sprintf("key-%04d", i)
		rec, ok, err := c.Get(ctx, key, now)
		require.NoError(t, err)
		if i%4 == 0 {
			require.True(t, ok, key)
			assert.Equal(t, backend.StateCompleted, rec.State, key)
			assert.Equal(t, value, rec.Value, key)
		} else {
			assert.False(t, ok, "%s was swept before the copy", key)
		}
	}
	_, won, err := c.Claim(ctx, backend.Record{Key: "after-compaction", Token: "t2", State: backend.StatePending}, now, time.Minute)
	require.NoError(t, err)
	assert.True(t, won)
}
