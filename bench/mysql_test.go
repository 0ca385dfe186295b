package bench

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"

	_ "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/seed094d4201/idem/internal/svctest"
	"github.com/seed094d4201/idem/mysql"
)

// mysqlDB opens IDEM_MYSQL_DSN with interpolateParams=true, as the mysql
// package doc advises (one round trip per statement), for idem and the
// raw statements alike; it skips without the variable.
func mysqlDB(b *testing.B) *sql.DB {
	dsn := svctest.MySQL(b)
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	db, err := sql.Open("mysql", dsn+sep+"interpolateParams=true")
	if err != nil {
		b.Fatal(err)
	}
	db.SetMaxIdleConns(64)
	b.Cleanup(func() { db.Close() })
	return db
}

// mysqlBackend returns a mysql Backend over a table of its own, dropped
// when the benchmark ends.
func mysqlBackend(b *testing.B) *mysql.Backend {
	db := mysqlDB(b)
	table := uniqueName("idem_bench_")
	be, err := mysql.New(context.Background(), db, mysql.Options{Table: table})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { db.Exec("DROP TABLE IF EXISTS " + table) })
	return be
}

// rawMySQL is what an expert writes for a durable claim then record, raw
// with database/sql: INSERT (a duplicate key fails it), then UPDATE by
// key and token; a replay is one SELECT.
type rawMySQL struct {
	db                     *sql.DB
	insert, update, replay string
	// ctx makes each operation's context: Background, or one that can
	// be cancelled, as an HTTP handler's request context can.
	ctx func() (context.Context, context.CancelFunc)
}

func newRawMySQL(b *testing.B, cancellable bool) *rawMySQL {
	db := mysqlDB(b)
	table := uniqueName("raw_")
	if _, err := db.Exec("CREATE TABLE " + table + " (k VARBINARY(255) PRIMARY KEY, token VARBINARY(64) NOT NULL, state TINYINT NOT NULL, value LONGBLOB) ENGINE = InnoDB"); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { db.Exec("DROP TABLE " + table) })
	return &rawMySQL{
		db:     db,
		insert: "INSERT INTO " + table + " (k, token, state) VALUES (?, ?, 1)",
		update: "UPDATE " + table + " SET state = 2, value = ? WHERE k = ? AND token = ?",
		replay: "SELECT state, value FROM " + table + " WHERE k = ?",
		ctx: func() (context.Context, context.CancelFunc) {
			if cancellable {
				return context.WithCancel(context.Background())
			}
			return context.Background(), func() {}
		},
	}
}

func (r *rawMySQL) newKey(key string) {
	ctx, cancel := r.ctx()
	defer cancel()
	k, token := []byte(key), []byte("0123456789abcdef0123456789abcdef")
	if _, err := r.db.ExecContext(ctx, r.insert, k, token); err != nil {
		panic(err)
	}
	if _, err := r.db.ExecContext(ctx, r.update, boltRecord, k, token); err != nil {
		panic(err)
	}
}

func (r *rawMySQL) replayKey(key string) {
	ctx, cancel := r.ctx()
	defer cancel()
	var state int
	var value []byte
	if err := r.db.QueryRowContext(ctx, r.replay, []byte(key)).Scan(&state, &value); err != nil {
		panic(err)
	}
}

// rawPostgresReplay is one SELECT of a completed key, raw with pgx.
func rawPostgresReplay(b *testing.B, pool *pgxpool.Pool, keys []string) func(key string) {
	ctx := context.Background()
	table := uniqueName("raw_")
	if _, err := pool.Exec(ctx, "CREATE TABLE "+table+" (key text PRIMARY KEY, token text NOT NULL, state smallint NOT NULL, value bytea)"); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { pool.Exec(context.Background(), "DROP TABLE "+table) })
	parallel(16, len(keys), func(i int) {
		if _, err := pool.Exec(ctx, "INSERT INTO "+table+" VALUES ($1, 'token', 2, $2)", keys[i], boltRecord); err != nil {
			panic(err)
		}
	})
	query := "SELECT state, value FROM " + table + " WHERE key = $1"
	return func(key string) {
		var state int
		var value []byte
		if err := pool.QueryRow(ctx, query, key).Scan(&state, &value); err != nil {
			panic(err)
		}
	}
}

// BenchmarkMySQL: a new key and a replay through a mysql-backed store, by
// 1 and 16 callers, against the raw statements (with context.Background,
// and with a context that can be cancelled, as a request's can: with one,
// database/sql and the driver watch it, a goroutine's wake-up or two a
// statement), and the same through a postgres-backed store and raw pgx,
// on this machine's servers.
func BenchmarkMySQL(b *testing.B) {
	for _, op := range []string{"newkey", "replay"} {
		for _, g := range []int{1, 16} {
			for _, im := range []struct {
				name string
				// new returns the operation over keys: for a replay,
				// keys are completed first.
				new func(b *testing.B, keys []string) func(string)
			}{
				{"idem-mysql", func(b *testing.B, keys []string) func(string) {
					do := idemShared(b, mysqlBackend(b))
					return prepared(op, keys, do, do)
				}},
				{"raw-mysql", func(b *testing.B, keys []string) func(string) {
					r := newRawMySQL(b, false)
					return prepared(op, keys, r.newKey, r.replayKey)
				}},
				{"raw-mysql-reqctx", func(b *testing.B, keys []string) func(string) {
					r := newRawMySQL(b, true)
					return prepared(op, keys, r.newKey, r.replayKey)
				}},
				{"idem-postgres", func(b *testing.B, keys []string) func(string) {
					do := idemShared(b, pgBackend(b))
					return prepared(op, keys, do, do)
				}},
				{"raw-postgres", func(b *testing.B, keys []string) func(string) {
					if op == "replay" {
						return rawPostgresReplay(b, pgPool(b), keys)
					}
					return rawPostgres(b, pgPool(b))
				}},
			} {
				b.Run(fmt.Sprintf("op=%s/impl=%s/g=%d", op, im.name, g), func(b *testing.B) {
					n := b.N
					if op == "replay" {
						n = replayKeys
					}
					keys := makeKeys(n)
					do := im.new(b, keys)
					forEach(b, g, func(i int) { do(keys[i%len(keys)]) })
					b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
				})
			}
		}
	}
}

// prepared returns newKey for op "newkey"; for "replay" it first runs
// newKey over keys, from 16 callers, and returns replay.
func prepared(op string, keys []string, newKey, replay func(string)) func(string) {
	if op == "newkey" {
		return newKey
	}
	parallel(16, len(keys), func(i int) { newKey(keys[i]) })
	return replay
}
