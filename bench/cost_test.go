package bench

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"
	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/bolt"
	"github.com/seed094d4201/idem/idemhttp"
	"github.com/seed094d4201/idem/internal/svctest"
	"github.com/seed094d4201/idem/postgres"
	"github.com/seed094d4201/idem/redis"
	"github.com/seed094d4201/idem/sqlite"
	bbolt "go.etcd.io/bbolt"
)

// BenchmarkCostPerKey measures what one remembered key costs on each
// backend, for the 1 KiB response of BenchmarkHTTP served through
// idemhttp.Middleware (an idem.Store[idemhttp.Response]). One op is a
// fresh store that remembers costKeys new keys, costWarmup of them first
// to warm pools and caches; ns/op is the time of that whole op, so run it
// with -benchtime 1x:
//
//	IDEM_POSTGRES_DSN='postgres://postgres@127.0.0.1:5432/test?sslmode=disable' IDEM_REDIS_ADDR=127.0.0.1:6379 \
//	  go test ./bench -run '^$' -bench CostPerKey -benchtime 1x
//
// Metrics, each averaged over the ops:
//
//   - heap-B/key: the Go heap the process retains per key, HeapAlloc after
//     two runtime.GC calls, before and after the costKeys keys (after the
//     warm-up), with the store and handler still alive. With a Backend
//     memory holds only keys in flight, so it should be about 0.
//   - value-B/key: the bytes the Store hands its Backend per key, the JSON
//     encoding of the idemhttp.Response (the body is base64 in it).
//   - storage-B/key: what the backend holds per key, measured from before
//     the first key (warm-up keys included in the count):
//     bolt, the file's size (after Close: every commit is fsynced);
//     sqlite, the file and its -wal after wal_checkpoint(TRUNCATE);
//     postgres, pg_total_relation_size of the backend's own table as
//     written, autovacuum off for it and no VACUUM, dead row versions
//     included; redis, INFO memory used_memory.
//   - further figures per backend: bolt's pages-B/key (pages its buckets
//     hold) and inuse-B/key (bytes in use on them); sqlite's pages-B/key
//     (pages in use, free pages left out); postgres's table-B/key and
//     index-B/key; redis's usage-B/key (MEMORY USAGE summed over the
//     backend's keys: immune to other clients
//     of the server) and key-B (MEMORY USAGE of one record).
//
// PostgreSQL and Redis come from IDEM_POSTGRES_DSN and IDEM_REDIS_ADDR, with
// a table and a key prefix of their own, dropped and deleted at the end;
// without them their sub-benchmarks skip, and fail when CI is true.
func BenchmarkCostPerKey(b *testing.B) {
	for _, t := range []costTarget{
		{"memory", 1, nil},
		{"bolt", 64, costBolt},
		{"sqlite", 16, costSQLite},
		{"postgres", 32, costPostgres},
		{"redis", 32, costRedis},
	} {
		b.Run("backend="+t.name, func(b *testing.B) {
			sums := map[string]float64{}
			for range b.N {
				for unit, v := range measureCost(b, t) {
					sums[unit] += v
				}
			}
			for unit, v := range sums {
				b.ReportMetric(v/float64(b.N), unit)
			}
		})
	}
}

const (
	costKeys   = 20000 // keys measured per op
	costWarmup = 512   // keys stored first, before the heap baseline
)

// A costTarget is one backend to measure. open returns the Backend (nil for
// none) and done, which the op calls once the Store is closed: done closes
// what open opened and returns what the backend holds now, less what it
// held when opened, in bytes by metric unit ("storage-B", ...), divided by
// the keys stored for the "/key" metrics; "key-B" is one key's already.
type costTarget struct {
	name    string
	workers int // goroutines serving requests, so that durable writes share commits
	open    func(b *testing.B) (backend.Backend, func() map[string]float64)
}

// costRequest is the request every key is sent with.
const costRequest = `{"order":101,"amount":450}`

// costKey is the i-th key, 36 characters like makeKeys's; it is made while
// the request is served, so that what the store keeps of it is counted.
func costKey(i int) string {
	x := uint64(i) * 0x9e3779b97f4a7c15
	return fmt.Sprintf("%08x-%04x-4%03x-a%03x-%012x", uint32(x>>32), uint16(x>>16), i&0xfff, (i>>12)&0xfff, uint64(i)&0xffffffffffff)
}

// measureCost runs one op on t and returns its metrics, per key.
func measureCost(b *testing.B, t costTarget) map[string]float64 {
	var be backend.Backend
	var done func() map[string]float64
	if t.open != nil {
		be, done = t.open(b)
	}
	s := idem.New[idemhttp.Response](idem.Options{Backend: be})
	closed := false
	closeStore := func() {
		if !closed {
			closed = true
			if err := s.Close(); err != nil {
				b.Errorf("closing the store: %v", err)
			}
		}
	}
	defer closeStore()
	h := idemhttp.Middleware(s, idemhttp.Options{Unscoped: true})(chargeHandler)

	var mu sync.Mutex
	var firstErr error
	serve := func(i int) {
		req := httptest.NewRequest(http.MethodPost, "/charges", strings.NewReader(costRequest))
		req.Header.Set(idemhttp.Header, costKey(i))
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if w.Code != http.StatusCreated || w.Body.Len() < 1000 || w.Header().Get(idemhttp.ReplayedHeader) != "" {
			mu.Lock()
			if firstErr == nil {
				firstErr = fmt.Errorf("key %d: status %d, %d bytes, replayed %q: %s", i, w.Code, w.Body.Len(), w.Header().Get(idemhttp.ReplayedHeader), w.Body.Bytes())
			}
			mu.Unlock()
		}
	}
	check := func() {
		if firstErr != nil {
			b.Fatal(firstErr)
		}
	}

	parallel(t.workers, costWarmup, serve)
	check()
	before := liveHeap()
	b.ResetTimer()
	parallel(t.workers, costKeys, func(i int) { serve(costWarmup + i) })
	b.StopTimer()
	check()
	after := liveHeap()
	runtime.KeepAlive(h)
	runtime.KeepAlive(s)

	total := costWarmup + costKeys
	wantLen := total
	if be != nil {
		wantLen = 0 // memory holds only keys in flight
	}
	if n := s.Len(); n != wantLen {
		b.Fatalf("memory holds %d keys, want %d", n, wantLen)
	}
	// The last key replays: its response was remembered.
	req := httptest.NewRequest(http.MethodPost, "/charges", strings.NewReader(costRequest))
	req.Header.Set(idemhttp.Header, costKey(total-1))
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	if w.Header().Get(idemhttp.ReplayedHeader) != "true" {
		b.Fatalf("key %d did not replay: status %d", total-1, w.Code)
	}

	m := map[string]float64{
		"heap-B/key":  float64(int64(after)-int64(before)) / costKeys,
		"value-B/key": float64(len(costValue(b, w))),
	}
	if done != nil {
		closeStore()
		for unit, v := range done() {
			if unit == "key-B" { // per key already
				m[unit] = v
				continue
			}
			m[unit+"/key"] = v / float64(total)
		}
	}
	return m
}

// costValue is the JSON encoding of the response w replayed, as the Store's
// JSONCodec writes it: what a backend stores, less its own record's fields.
func costValue(b *testing.B, w *httptest.ResponseRecorder) []byte {
	resp := idemhttp.Response{Status: w.Code, Header: w.Header().Clone(), Body: w.Body.Bytes()}
	resp.Header.Del(idemhttp.ReplayedHeader)
	v, err := idem.JSONCodec{}.Marshal(resp)
	if err != nil {
		b.Fatal(err)
	}
	var back idemhttp.Response
	if err := json.Unmarshal(v, &back); err != nil || len(back.Body) != w.Body.Len() {
		b.Fatalf("the response does not round-trip: %v", err)
	}
	return v
}

// liveHeap is the heap in use once the collector has run to completion
// twice (the second pass frees what the first one's finalizers let go).
func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// costDir is a directory for the op's files, removed at the end: on tmpfs
// (/dev/shm) where there is one, since what is measured is the bytes a file
// holds, which are the same on any file system, and not the time of its
// fsyncs, which on a disk make the op minutes long; b.TempDir() otherwise.
func costDir(b *testing.B) string {
	dir, err := os.MkdirTemp("/dev/shm", "idem-cost-")
	if err != nil {
		return b.TempDir()
	}
	b.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// costBolt opens a bolt file in costDir. Its file is measured closed, with
// bbolt's bucket statistics.
func costBolt(b *testing.B) (backend.Backend, func() map[string]float64) {
	path := filepath.Join(costDir(b), "cost.db")
	be, err := bolt.Open(path, nil)
	if err != nil {
		b.Fatal(err)
	}
	if err := be.Close(); err != nil { // the empty file, measured as it starts
		b.Fatal(err)
	}
	empty := boltUsage(b, path)
	if be, err = bolt.Open(path, nil); err != nil {
		b.Fatal(err)
	}
	return be, func() map[string]float64 {
		if err := be.Close(); err != nil {
			b.Fatal(err)
		}
		return minus(boltUsage(b, path), empty)
	}
}

// boltUsage is the size of the closed bolt file at path, the pages its
// buckets hold and the bytes in use on them; it checks that every key the
// op stored is there.
func boltUsage(b *testing.B, path string) map[string]float64 {
	fi, err := os.Stat(path)
	if err != nil {
		b.Fatal(err)
	}
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	m := map[string]float64{"storage-B": float64(fi.Size())}
	err = db.View(func(tx *bbolt.Tx) error {
		var pages, inuse int
		return tx.ForEach(func(name []byte, bk *bbolt.Bucket) error {
			st := bk.Stats()
			n := st.BranchPageN + st.BranchOverflowN + st.LeafPageN + st.LeafOverflowN
			pages += n
			inuse += st.BranchInuse + st.LeafInuse
			if st.KeyN > 0 {
				b.Logf("bolt bucket %s: %d keys, %d pages (%d leaf, %d leaf overflow), %d bytes in use", name, st.KeyN, n, st.LeafPageN, st.LeafOverflowN, st.BranchInuse+st.LeafInuse)
			}
			m["pages-B"] = float64(pages * db.Info().PageSize)
			m["inuse-B"] = float64(inuse)
			if string(name) == "idem.records" {
				m["records"] = float64(st.KeyN)
				if k, v := bk.Cursor().First(); k != nil {
					var rec backend.Record
					if err := rec.UnmarshalBinary(v); err != nil {
						return err
					}
					b.Logf("bolt record %s: %d bytes, its value %d", k, len(v), len(rec.Value))
				}
			}
			return nil
		})
	})
	if err != nil {
		b.Fatal(err)
	}
	if n := int(m["records"]); n != 0 && n != costWarmup+costKeys {
		b.Fatalf("the file holds %d records, want %d", n, costWarmup+costKeys)
	}
	delete(m, "records")
	return m
}

// costSQLite opens a sqlite file in costDir with sqlite.Open, as a service
// would; its size is read after a checkpoint that empties the -wal.
func costSQLite(b *testing.B) (backend.Backend, func() map[string]float64) {
	path := filepath.Join(costDir(b), "cost.db")
	db, err := sqlite.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	be, err := sqlite.New(context.Background(), db, sqlite.Options{})
	if err != nil {
		db.Close()
		b.Fatal(err)
	}
	empty := sqliteUsage(b, db, path, 0)
	return be, func() map[string]float64 {
		defer db.Close()
		return minus(sqliteUsage(b, db, path, costWarmup+costKeys), empty)
	}
}

func sqliteUsage(b *testing.B, db *sql.DB, path string, want int) map[string]float64 {
	ctx := context.Background()
	var busy, logged, moved int
	if err := db.QueryRowContext(ctx, "PRAGMA wal_checkpoint(TRUNCATE)").Scan(&busy, &logged, &moved); err != nil || busy != 0 {
		b.Fatalf("checkpoint: busy %d, %v", busy, err)
	}
	var size int64
	for _, name := range []string{path, path + "-wal"} {
		if fi, err := os.Stat(name); err == nil {
			size += fi.Size()
		} else if !errors.Is(err, os.ErrNotExist) {
			b.Fatal(err)
		}
	}
	var pages, free, pageSize, n int
	for q, v := range map[string]*int{
		"PRAGMA page_count":              &pages,
		"PRAGMA freelist_count":          &free,
		"PRAGMA page_size":               &pageSize,
		"SELECT count(*) FROM idem_keys": &n,
	} {
		if err := db.QueryRowContext(ctx, q).Scan(v); err != nil {
			b.Fatalf("%s: %v", q, err)
		}
	}
	if n != want {
		b.Fatalf("the table holds %d rows, want %d", n, want)
	}
	if want > 0 { // where the pages go: the table's b-tree, its overflow pages, the index
		rows, err := db.QueryContext(ctx, "SELECT name, pagetype, count(*), sum(payload), sum(unused) FROM dbstat GROUP BY name, pagetype ORDER BY name, pagetype")
		if err != nil {
			b.Fatal(err)
		}
		defer rows.Close()
		for rows.Next() {
			var name, kind string
			var count, payload, unused int
			if err := rows.Scan(&name, &kind, &count, &payload, &unused); err != nil {
				b.Fatal(err)
			}
			b.Logf("sqlite %s %s pages: %d (%.0f B/key), payload %.0f B/key, unused %.0f B/key", name, kind, count, float64(count*pageSize)/float64(want), float64(payload)/float64(want), float64(unused)/float64(want))
		}
		if err := rows.Err(); err != nil {
			b.Fatal(err)
		}
	}
	return map[string]float64{"storage-B": float64(size), "pages-B": float64((pages - free) * pageSize)}
}

// costPostgres opens a postgres Backend over a table of its own, with
// autovacuum off for it so that the size is the one as written (dead row
// versions included); the table is dropped at the end.
func costPostgres(b *testing.B) (backend.Backend, func() map[string]float64) {
	dsn := svctest.Postgres(b)
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		b.Fatal(err)
	}
	// Commits need not wait for the WAL's flush: what is measured is the
	// table's bytes, not commit latency.
	cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
	cfg.MaxConns = 32 // one a worker
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	// Open the connections the workers use, and have each run a query (pgx
	// gives a connection its buffers of rows at its first), before the
	// heap's baseline.
	conns := make([]*pgxpool.Conn, 32)
	for i := range conns {
		if conns[i], err = pool.Acquire(ctx); err != nil {
			b.Fatal(err)
		}
		var one int
		if err := conns[i].QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
			b.Fatal(err)
		}
	}
	for _, c := range conns {
		c.Release()
	}
	table := uniqueName("idem_cost_")
	be, err := postgres.New(ctx, pool, postgres.Options{Table: table})
	if err != nil {
		b.Fatal(err)
	}
	ident := pgx.Identifier{table}.Sanitize()
	b.Cleanup(func() {
		if _, err := pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+ident); err != nil {
			b.Errorf("dropping %s: %v", table, err)
		}
	})
	if _, err := pool.Exec(ctx, "ALTER TABLE "+ident+" SET (autovacuum_enabled = false, toast.autovacuum_enabled = false)"); err != nil {
		b.Fatal(err)
	}
	usage := func(want int) map[string]float64 {
		var total, tbl, idx, n int64
		err := pool.QueryRow(ctx, "SELECT pg_total_relation_size($1::regclass), pg_table_size($1::regclass), pg_indexes_size($1::regclass), (SELECT count(*) FROM "+ident+")", ident).Scan(&total, &tbl, &idx, &n)
		if err != nil {
			b.Fatal(err)
		}
		if n != int64(want) {
			b.Fatalf("the table holds %d rows, want %d", n, want)
		}
		if want > 0 { // the live rows' own bytes, against the pages they take
			var live int64
			if err := pool.QueryRow(ctx, "SELECT sum(pg_column_size(t.*)) FROM "+ident+" t").Scan(&live); err != nil {
				b.Fatal(err)
			}
			b.Logf("postgres live rows: %.0f B/key (pg_column_size)", float64(live)/float64(want))
		}
		return map[string]float64{"storage-B": float64(total), "table-B": float64(tbl), "index-B": float64(idx)}
	}
	empty := usage(0)
	return be, func() map[string]float64 { return minus(usage(costWarmup+costKeys), empty) }
}

// costRedis opens a redis Backend under a prefix of its own, whose keys are
// deleted at the end. The client's connections are opened before the
// baseline, so that used_memory's delta holds no new clients' buffers.
func costRedis(b *testing.B) (backend.Backend, func() map[string]float64) {
	addr := svctest.Redis(b)
	ctx := context.Background()
	rdb := goredis.NewClient(&goredis.Options{Addr: addr, PoolSize: 64})
	b.Cleanup(func() { rdb.Close() })
	conns := make([]*goredis.Conn, 32)
	for i := range conns {
		conns[i] = rdb.Conn()
		if err := conns[i].Ping(ctx).Err(); err != nil {
			b.Fatal(err)
		}
	}
	for _, c := range conns {
		c.Close()
	}
	prefix := uniqueName("idemcost:") + ":"
	scan := func(each func(keys []string)) {
		iter := rdb.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		var keys []string
		for iter.Next(ctx) {
			if keys = append(keys, iter.Val()); len(keys) == 1000 {
				each(keys)
				keys = keys[:0]
			}
		}
		if err := iter.Err(); err != nil {
			b.Fatal(err)
		}
		if len(keys) > 0 {
			each(keys)
		}
	}
	b.Cleanup(func() { scan(func(keys []string) { rdb.Del(ctx, keys...) }) })
	usedMemory := func() float64 {
		info, err := rdb.Info(ctx, "memory").Result()
		if err != nil {
			b.Fatal(err)
		}
		for line := range strings.Lines(info) {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					b.Fatal(err)
				}
				return float64(n)
			}
		}
		b.Fatal("INFO memory has no used_memory")
		return 0
	}
	empty := usedMemory()
	be := redis.New(rdb, redis.Options{Prefix: prefix})
	return be, func() map[string]float64 {
		m := map[string]float64{"storage-B": usedMemory() - empty}
		var usage int64
		records := 0
		scan(func(keys []string) {
			cmds := make([]*goredis.IntCmd, len(keys))
			_, err := rdb.Pipelined(ctx, func(p goredis.Pipeliner) error {
				for i, k := range keys {
					cmds[i] = p.MemoryUsage(ctx, k, 0)
				}
				return nil
			})
			if err != nil {
				b.Fatal(err)
			}
			for i, c := range cmds {
				usage += c.Val()
				if keys[i] == prefix+"expiry" {
					b.Logf("redis expiry index %s: %.0f B/key", keys[i], float64(c.Val())/float64(costWarmup+costKeys))
				}
				if strings.HasPrefix(keys[i], prefix+"k:") {
					records++
				}
			}
		})
		if records != costWarmup+costKeys {
			b.Fatalf("redis holds %d records, want %d", records, costWarmup+costKeys)
		}
		m["usage-B"] = float64(usage)
		one, err := rdb.MemoryUsage(ctx, prefix+"k:"+idemhttp.StoreKey("", costKey(0)), 0).Result()
		if err != nil {
			b.Fatal(err)
		}
		m["key-B"] = float64(one)
		return m
	}
}

// minus returns a less b, unit by unit.
func minus(a, b map[string]float64) map[string]float64 {
	d := make(map[string]float64, len(a))
	for unit, v := range a {
		d[unit] = v - b[unit]
	}
	return d
}
