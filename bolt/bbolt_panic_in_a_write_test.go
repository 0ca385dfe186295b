package bolt

import (
	"context"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed094d4201/idem/backend"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.etcd.io/bbolt"
)

// bbolt that panics in a write outside the write's own work (a damaged
// page read as it begins, commits or rolls back its transaction) may keep
// its writer lock, and every later write would wait for it for ever: the
// backend answers the writes after with that failure (ErrCorrupt), at
// once. CI once saw a damaged file's Sweep hang so.
func TestWritesAfterBboltPanickedInAWriteFailAtOnce(t *testing.T) {
	b, err := Open(filepath.Join(t.TempDir(), "idem.db"), nil)
	require.NoError(t, err)
	var leaked *bbolt.Tx
	var fired atomic.Bool
	testHookUpdate = func(db *bbolt.DB) {
		if fired.CompareAndSwap(false, true) {
			leaked, _ = db.Begin(true) // held, as a transaction bbolt panicked in
			panic("unexpected fault address (damaged page)")
		}
	}
	t.Cleanup(func() {
		testHookUpdate = nil
		if leaked != nil {
			_ = leaked.Rollback() // lets Close finish
		}
		_ = b.Close()
	})
	ctx := context.Background()
	now := time.Now()
	_, _, err = b.Claim(ctx, backend.Record{Key: "a", Token: "t", State: backend.StatePending}, now, time.Minute)
	require.ErrorIs(t, err, ErrCorrupt)

	done := make(chan error, 1)
	go func() {
		_, _, err := b.Claim(ctx, backend.Record{Key: "b", Token: "t", State: backend.StatePending}, now, time.Minute)
		done <- err
	}()
	select {
	case err := <-done:
		assert.ErrorIs(t, err, ErrCorrupt)
	case <-time.After(10 * time.Second):
		t.Fatal("a write after bbolt panicked waits for its writer lock")
	}
}
