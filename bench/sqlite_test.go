package bench

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"sync"
	"testing"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/sqlite"
)

// The SQLite benchmarks open their files with sqlite.Open (WAL, fsync at
// every commit, busy timeout) under b.TempDir(): the raw baselines run on
// the same settings.

func openSQLite(b *testing.B, name string) *sql.DB {
	db, err := sqlite.Open(filepath.Join(b.TempDir(), name))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { db.Close() })
	return db
}

func idemSQLite(b *testing.B) (*idem.Store[receipt], *sql.DB, func(key string)) {
	db := openSQLite(b, "idem.db")
	be, err := sqlite.New(context.Background(), db, sqlite.Options{})
	if err != nil {
		b.Fatal(err)
	}
	s := idem.New[receipt](idem.Options{Backend: be})
	b.Cleanup(func() { s.Close() })
	ctx := context.Background()
	fn := func(context.Context) (receipt, error) { return fnReceipt, nil }
	return s, db, func(key string) {
		if _, err := s.RunOnce(ctx, key, boxed, fn); err != nil {
			panic(err)
		}
	}
}

// rawSQLite issues the two statements a durable claim-then-record needs,
// raw through database/sql: INSERT ... ON CONFLICT DO NOTHING, then UPDATE,
// each its own commit. serial queues the writers on a mutex, as idem's
// backend does, instead of in SQLite's busy handler.
func rawSQLite(b *testing.B, serial bool) func(key string) {
	db := openSQLite(b, "raw.db")
	ctx := context.Background()
	if _, err := db.Exec(`CREATE TABLE raw (key TEXT PRIMARY KEY, token TEXT NOT NULL, state INTEGER NOT NULL, value BLOB) WITHOUT ROWID`); err != nil {
		b.Fatal(err)
	}
	var mu sync.Mutex
	exec := func(query string, args ...any) {
		if serial {
			mu.Lock()
			defer mu.Unlock()
		}
		if _, err := db.ExecContext(ctx, query, args...); err != nil {
			panic(err)
		}
	}
	return func(key string) {
		exec(`INSERT INTO raw (key, token, state) VALUES (?, ?, 1) ON CONFLICT DO NOTHING`, key, "0123456789abcdef0123456789abcdef")
		exec(`UPDATE raw SET state = 2, value = ? WHERE key = ? AND token = ?`, boltRecord, key, "0123456789abcdef0123456789abcdef")
	}
}

// BenchmarkSQLiteNewKey: a new key through a sqlite-backed store (claim
// committed before fn, outcome committed before the answer) against the
// same two statements issued raw, by 1 and 16 callers.
func BenchmarkSQLiteNewKey(b *testing.B) {
	for _, g := range []int{1, 16} {
		for _, im := range []struct {
			name string
			new  func(b *testing.B) func(string)
		}{
			{"idem", func(b *testing.B) func(string) { _, _, do := idemSQLite(b); return do }},
			{"raw", func(b *testing.B) func(string) { return rawSQLite(b, false) }},
			{"raw-serial", func(b *testing.B) func(string) { return rawSQLite(b, true) }},
		} {
			b.Run(fmt.Sprintf("impl=%s/g=%d", im.name, g), func(b *testing.B) {
				do := im.new(b)
				keys := makeKeys(b.N)
				forEach(b, g, func(i int) { do(keys[i]) })
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
			})
		}
	}
}

// BenchmarkSQLiteReplay replays keys that live only in the file, against
// the floor: the raw read of the same rows, one prepared SELECT each.
func BenchmarkSQLiteReplay(b *testing.B) {
	for _, g := range []int{1, 16} {
		b.Run(fmt.Sprintf("impl=idem/g=%d", g), func(b *testing.B) {
			s, _, do := idemSQLite(b)
			keys := makeKeys(replayKeys)
			parallel(16, len(keys), func(i int) { do(keys[i]) })
			if s.Len() != 0 {
				b.Fatalf("memory holds %d keys", s.Len())
			}
			forEach(b, g, func(i int) { do(keys[i%replayKeys]) })
		})
		b.Run(fmt.Sprintf("impl=raw-select/g=%d", g), func(b *testing.B) {
			_, db, do := idemSQLite(b)
			keys := makeKeys(replayKeys)
			parallel(16, len(keys), func(i int) { do(keys[i]) })
			st, err := db.Prepare(`SELECT key, fingerprint, token, state, created_at, expires_at, lease_until, value, failed, err_msg FROM idem_keys WHERE key = ?`)
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			forEach(b, g, func(i int) {
				var rec struct {
					key, token, errMsg string
					fp, value          []byte
					state, created     int64
					expires, lease     sql.NullInt64
					failed             bool
				}
				if err := st.QueryRowContext(ctx, keys[i%replayKeys]).Scan(&rec.key, &rec.fp, &rec.token, &rec.state, &rec.created, &rec.expires, &rec.lease, &rec.value, &rec.failed, &rec.errMsg); err != nil {
					panic(err)
				}
			})
		})
	}
}
