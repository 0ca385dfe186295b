package bench

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"
	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/internal/svctest"
	"github.com/seed094d4201/idem/postgres"
	"github.com/seed094d4201/idem/redis"
)

// The shared-backend benchmarks need the services the tests use; they skip
// without IDEM_POSTGRES_DSN or IDEM_REDIS_ADDR.

func pgPool(b *testing.B) *pgxpool.Pool {
	dsn := svctest.Postgres(b)
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	return pool
}

func redisClient(b *testing.B) goredis.UniversalClient {
	addr := svctest.Redis(b)
	rdb := goredis.NewUniversalClient(&goredis.UniversalOptions{Addrs: []string{addr}, PoolSize: 64})
	b.Cleanup(func() { rdb.Close() })
	return rdb
}

// pgBackend returns a postgres Backend over a table of its own, dropped
// when the benchmark ends.
func pgBackend(b *testing.B) *postgres.Backend {
	pool := pgPool(b)
	table := uniqueName("idem_bench_")
	be, err := postgres.New(context.Background(), pool, postgres.Options{Table: table})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+table) })
	return be
}

func uniqueName(prefix string) string {
	return prefix + strconv.FormatInt(time.Now().UnixNano(), 36)
}

// idemShared returns a RunOnce over backend. Outcomes live a minute, so
// that Redis soon drops what a run wrote.
func idemShared(b *testing.B, backend backend.Backend) func(key string) {
	s := idem.New[receipt](idem.Options{Backend: backend, TTL: time.Minute})
	b.Cleanup(func() { s.Close() })
	ctx := context.Background()
	fn := func(context.Context) (receipt, error) { return fnReceipt, nil }
	return func(key string) {
		if _, err := s.RunOnce(ctx, key, boxed, fn); err != nil {
			panic(err)
		}
	}
}

// rawPostgres issues the two statements a durable claim-then-record needs,
// raw with pgx: INSERT ... ON CONFLICT DO NOTHING, then UPDATE.
func rawPostgres(b *testing.B, pool *pgxpool.Pool) func(key string) {
	return rawPostgresCtx(b, pool, false)
}

// rawPostgresCtx is rawPostgres, each operation under a context that can be
// cancelled if cancellable, as an HTTP handler's request context can: pgx
// then watches it, a goroutine started and stopped for each statement.
func rawPostgresCtx(b *testing.B, pool *pgxpool.Pool, cancellable bool) func(key string) {
	table := uniqueName("raw_")
	ctx := context.Background()
	if _, err := pool.Exec(ctx, "CREATE TABLE "+table+" (key text PRIMARY KEY, token text NOT NULL, state smallint NOT NULL, value bytea)"); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { pool.Exec(context.Background(), "DROP TABLE "+table) })
	insert := "INSERT INTO " + table + " (key, token, state) VALUES ($1, $2, 1) ON CONFLICT DO NOTHING"
	update := "UPDATE " + table + " SET state = 2, value = $3 WHERE key = $1 AND token = $2"
	return func(key string) {
		ctx, cancel := ctx, context.CancelFunc(func() {})
		if cancellable {
			ctx, cancel = context.WithCancel(ctx)
		}
		defer cancel()
		if _, err := pool.Exec(ctx, insert, key, "0123456789abcdef0123456789abcdef"); err != nil {
			panic(err)
		}
		if _, err := pool.Exec(ctx, update, key, "0123456789abcdef0123456789abcdef", boltRecord); err != nil {
			panic(err)
		}
	}
}

// rawRedis issues SET NX, then a Lua script that compares the token and
// writes the outcome with a TTL.
func rawRedis(b *testing.B, rdb goredis.UniversalClient) func(key string) {
	prefix := uniqueName("raw:") + ":"
	complete := goredis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'PX', 60000)
return 1`)
	ctx := context.Background()
	return func(key string) {
		k := prefix + key
		if err := rdb.SetNX(ctx, k, "token", 0).Err(); err != nil {
			panic(err)
		}
		if err := complete.Run(ctx, rdb, []string{k}, "token", boltRecord).Err(); err != nil {
			panic(err)
		}
	}
}

// BenchmarkSharedNewKey: a new key through a postgres- or redis-backed store
// against the raw statements, by 1, 16 and 32 callers.
func BenchmarkSharedNewKey(b *testing.B) {
	for _, g := range []int{1, 16, 32} {
		for _, im := range []struct {
			name string
			new  func(b *testing.B) func(string)
		}{
			{"idem-postgres", func(b *testing.B) func(string) { return idemShared(b, pgBackend(b)) }},
			{"raw-postgres", func(b *testing.B) func(string) { return rawPostgres(b, pgPool(b)) }},
			{"raw-postgres-reqctx", func(b *testing.B) func(string) { return rawPostgresCtx(b, pgPool(b), true) }},
			{"idem-redis", func(b *testing.B) func(string) {
				return idemShared(b, redis.New(redisClient(b), redis.Options{Prefix: uniqueName("idembench:") + ":"}))
			}},
			{"raw-redis", func(b *testing.B) func(string) { return rawRedis(b, redisClient(b)) }},
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

// BenchmarkSharedReplay: 32 callers replaying completed keys.
func BenchmarkSharedReplay(b *testing.B) {
	for _, im := range []struct {
		name string
		new  func(b *testing.B) backend.Backend
	}{
		{"idem-postgres", func(b *testing.B) backend.Backend { return pgBackend(b) }},
		{"idem-redis", func(b *testing.B) backend.Backend {
			return redis.New(redisClient(b), redis.Options{Prefix: uniqueName("idembench:") + ":"})
		}},
	} {
		b.Run(fmt.Sprintf("impl=%s/g=32", im.name), func(b *testing.B) {
			do := idemShared(b, im.new(b))
			keys := makeKeys(replayKeys)
			parallel(32, len(keys), func(i int) { do(keys[i]) })
			forEach(b, 32, func(i int) { do(keys[i%replayKeys]) })
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
		})
	}
}
