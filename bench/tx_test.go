package bench

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/bolt"
	"github.com/seed094d4201/idem/sqlite"
	bbolt "go.etcd.io/bbolt"
)

// BenchmarkRunOnceTx: the caller's own write (one row, one bucket entry)
// through RunOnceTx, which commits it with the key and the outcome, against
// the same write in the caller's own transaction without idem, by 1 and 16
// callers. On bbolt the caller's own transaction is DB.Update (one commit
// each) or DB.Batch (group commit, batch size the number of callers).
func BenchmarkRunOnceTx(b *testing.B) {
	for _, g := range []int{1, 16} {
		for _, im := range []struct {
			name string
			new  func(b *testing.B) func(string)
		}{
			{"sqlite-idem", sqliteRunOnceTx},
			{"sqlite-raw", sqliteOwnTx},
			{"bolt-idem", boltRunOnceTx},
			{"bolt-raw-update", func(b *testing.B) func(string) { return boltOwnTx(b, false, g) }},
			{"bolt-raw-batch", func(b *testing.B) func(string) { return boltOwnTx(b, true, g) }},
		} {
			if g == 1 && im.name == "bolt-raw-batch" {
				continue // a lone DB.Batch caller waits out the batch timer
			}
			b.Run(fmt.Sprintf("impl=%s/g=%d", im.name, g), func(b *testing.B) {
				do := im.new(b)
				keys := makeKeys(b.N)
				forEach(b, g, func(i int) { do(keys[i]) })
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
			})
		}
	}
}

const createOrders = `CREATE TABLE orders (key TEXT PRIMARY KEY, body BLOB NOT NULL) WITHOUT ROWID`

func sqliteRunOnceTx(b *testing.B) func(string) {
	db := openSQLite(b, "idem.db")
	be, err := sqlite.New(context.Background(), db, sqlite.Options{})
	if err == nil {
		_, err = db.Exec(createOrders)
	}
	if err != nil {
		b.Fatal(err)
	}
	s := idem.New[receipt](idem.Options{Backend: be})
	b.Cleanup(func() { s.Close() })
	ctx := context.Background()
	return func(key string) {
		_, err := sqlite.RunOnceTx(ctx, s, key, boxed, func(ctx context.Context, tx *sql.Tx) (receipt, error) {
			_, err := tx.ExecContext(ctx, `INSERT INTO orders (key, body) VALUES (?, ?)`, key, boltRecord)
			return fnReceipt, err
		})
		if err != nil {
			panic(err)
		}
	}
}

// sqliteOwnTx is the caller's transaction without idem: BEGIN, the write,
// COMMIT.
func sqliteOwnTx(b *testing.B) func(string) {
	db := openSQLite(b, "raw.db")
	if _, err := db.Exec(createOrders); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	return func(key string) {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			panic(err)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO orders (key, body) VALUES (?, ?)`, key, boltRecord); err != nil {
			panic(err)
		}
		if err := tx.Commit(); err != nil {
			panic(err)
		}
	}
}

var ordersBucket = []byte("orders")

func boltRunOnceTx(b *testing.B) func(string) {
	be, err := bolt.Open(filepath.Join(b.TempDir(), "idem.db"), nil)
	if err != nil {
		b.Fatal(err)
	}
	s := idem.New[receipt](idem.Options{Backend: be})
	b.Cleanup(func() {
		s.Close()
		be.Close()
	})
	ctx := context.Background()
	if err := be.Update(ctx, func(tx *bbolt.Tx) error { _, err := tx.CreateBucket(ordersBucket); return err }); err != nil {
		b.Fatal(err)
	}
	return func(key string) {
		_, err := bolt.RunOnceTx(ctx, s, key, boxed, func(ctx context.Context, tx *bbolt.Tx) (receipt, error) {
			return fnReceipt, tx.Bucket(ordersBucket).Put([]byte(key), boltRecord)
		})
		if err != nil {
			panic(err)
		}
	}
}

// boltOwnTx is the caller's transaction without idem, on a bbolt file of
// its own: DB.Update, or DB.Batch with the batch size set to the number of
// writers so that none waits for the timer.
func boltOwnTx(b *testing.B, batch bool, writers int) func(string) {
	db, err := bbolt.Open(filepath.Join(b.TempDir(), "raw.db"), 0o600, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { db.Close() })
	db.MaxBatchSize = writers
	if err := db.Update(func(tx *bbolt.Tx) error { _, err := tx.CreateBucket(ordersBucket); return err }); err != nil {
		b.Fatal(err)
	}
	write := db.Update
	if batch {
		write = db.Batch
	}
	return func(key string) {
		if err := write(func(tx *bbolt.Tx) error { return tx.Bucket(ordersBucket).Put([]byte(key), boltRecord) }); err != nil {
			panic(err)
		}
	}
}
