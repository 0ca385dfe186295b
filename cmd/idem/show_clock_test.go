package main

import (
	"context"
	"database/sql"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/internal/svctest"
	"github.com/seed094d4201/idem/mysql"
	"github.com/seed094d4201/idem/postgres"
	"github.com/seed094d4201/idem/redis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// On a shared backend, show and inspect judge a lease by the server's
// clock, not the operator's host's: on a host whose clock runs an hour
// ahead, a key whose owner holds a ten-minute lease is shown pending, and
// the operator is not told to forget it (show said "interrupted (lease
// lapsed)" and printed the forget command).
func TestShowJudgesLeaseByServerClock(t *testing.T) {
	ctx := context.Background()
	suffix := strconv.FormatInt(time.Now().UnixNano(), 36)
	for _, tc := range []struct {
		name    string
		where   func(t testing.TB) string
		table   string
		backend func(t *testing.T) backend.Backend
	}{
		{"postgres", svctest.Postgres, "idem_clk_" + suffix, func(t *testing.T) backend.Backend {
			pool, err := pgxpool.New(ctx, svctest.Postgres(t))
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			t.Cleanup(func() { pool.Exec(ctx, "DROP TABLE IF EXISTS idem_clk_"+suffix) })
			b, err := postgres.New(ctx, pool, postgres.Options{Table: "idem_clk_" + suffix})
			require.NoError(t, err)
			return b
		}},
		{"mysql", func(t testing.TB) string { return mysqlURL(svctest.MySQL(t)) }, "idem_clk_" + suffix, func(t *testing.T) backend.Backend {
			db, err := sql.Open("mysql", svctest.MySQL(t))
			require.NoError(t, err)
			t.Cleanup(func() { db.Close() })
			t.Cleanup(func() { db.Exec("DROP TABLE IF EXISTS idem_clk_" + suffix) })
			b, err := mysql.New(ctx, db, mysql.Options{Table: "idem_clk_" + suffix})
			require.NoError(t, err)
			return b
		}},
		{"redis", func(t testing.TB) string { return "redis://" + svctest.Redis(t) }, "idemclk:" + suffix + ":", func(t *testing.T) backend.Backend {
			rdb := goredis.NewClient(&goredis.Options{Addr: svctest.Redis(t)})
			t.Cleanup(func() {
				iter := rdb.Scan(ctx, 0, "idemclk:"+suffix+":*", 100).Iterator()
				for iter.Next(ctx) {
					rdb.Del(ctx, iter.Val())
				}
				rdb.Close()
			})
			return redis.New(rdb, redis.Options{Prefix: "idemclk:" + suffix + ":"})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			where := tc.where(t) // or skip
			b := tc.backend(t)
			_, won, err := b.Claim(ctx, backend.Record{Key: "live", Token: "owner", State: backend.StatePending}, time.Now(), 10*time.Minute)
			require.NoError(t, err)
			require.True(t, won)

			ahead := time.Now().Add(time.Hour) // the operator's host clock
			var out, errs strings.Builder
			code := run([]string{"show", where, "live", "-name", tc.table}, &out, &errs, ahead)
			require.Equal(t, 0, code, errs.String())
			assert.Contains(t, out.String(), "state:       pending\n")
			assert.NotContains(t, out.String(), "forget", "show told the operator to forget a key whose lease holds")

			out.Reset()
			code = run([]string{"inspect", where, "-name", tc.table}, &out, &errs, ahead)
			require.Equal(t, 0, code, errs.String())
			assert.Contains(t, out.String(), `"live"  pending`)

			out.Reset()
			errs.Reset()
			code = run([]string{"forget", where, "live", "-name", tc.table}, &out, &errs, ahead)
			assert.Equal(t, 1, code)
			assert.Contains(t, errs.String(), "lease holds until")
			assert.NotContains(t, errs.String(), "-50m", "the time left is the server's")
		})
	}
}
