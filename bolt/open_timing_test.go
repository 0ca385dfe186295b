package bolt

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/seed094d4201/idem/backend"
	"github.com/stretchr/testify/require"
	bbolt "go.etcd.io/bbolt"
)

// TestOpenTimingWithWholeFileCheck measures Open with and without the whole-file check on an
// ~80 MB idem file (1 KB values), and on one with 256 KB values, whose
// overflow pages the walk never reads.
func TestOpenTimingWithWholeFileCheck(t *testing.T) {
	if os.Getenv("IDEM_HOSTILE_TIMING") == "" {
		t.Skip("set IDEM_HOSTILE_TIMING=1")
	}
	for _, c := range []struct{ n, size int }{{80000, 1000}, {320, 256 << 10}} {
		path := filepath.Join(t.TempDir(), "big.db")
		db, err := bbolt.Open(path, 0o600, nil)
		require.NoError(t, err)
		now := time.Now()
		require.NoError(t, db.Update(func(tx *bbolt.Tx) error {
			m, _ := tx.CreateBucket(bucketMeta)
			m.Put(formatKey, formatVersion)
			r, _ := tx.CreateBucket(bucketRecords)
			r.FillPercent = 0.9
			e, _ := tx.CreateBucket(bucketExpiry)
			tx.CreateBucket(bucketPending)
			val := make([]byte, c.size)
			for i := range c.n {
				rec := backend.Record{Key: fmt.Sprintf("key-%08d", i), Token: "t", State: backend.StateCompleted, CreatedAt: now, ExpiresAt: now.Add(time.Hour), Value: val}
				enc, err := rec.MarshalBinary()
				if err != nil {
					return err
				}
				if err := r.Put([]byte(rec.Key), enc); err != nil {
					return err
				}
				if err := e.Put(expiryKey(rec), nil); err != nil {
					return err
				}
			}
			return nil
		}))
		require.NoError(t, db.Close())
		fi, _ := os.Stat(path)
		for _, check := range []Check{CheckAlways, CheckNever, CheckAlways, CheckNever, CheckAlways, CheckNever} {
			start := time.Now()
			b, err := Open(path, &Options{Check: check})
			require.NoError(t, err)
			d := time.Since(start)
			require.NoError(t, b.Close())
			t.Logf("file %d MB, values %d B: Open Check=%v: %v", fi.Size()>>20, c.size, check, d)
		}
	}
}
