package main

import (
	"context"
	"database/sql"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"
	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/internal/svctest"
	"github.com/seed094d4201/idem/mysql"
	"github.com/seed094d4201/idem/postgres"
	"github.com/seed094d4201/idem/redis"
	"github.com/seed094d4201/idem/sqlite"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A key whose owner died mid-run, on a shared backend: inspect shows it
// interrupted once its lease lapsed, and forget clears it.
func TestSharedBackends(t *testing.T) {
	ctx := context.Background()
	suffix := strconv.FormatInt(time.Now().UnixNano(), 36)
	dead := backend.Record{Key: "order-103", Token: "dead", State: backend.StatePending}
	sqlitePath := filepath.Join(t.TempDir(), "shop.db")
	for _, tc := range []struct {
		name    string
		where   func(t testing.TB) string
		table   string
		backend func(t *testing.T) backend.Backend
	}{
		{"postgres", svctest.Postgres, "idem_cli_" + suffix, func(t *testing.T) backend.Backend {
			pool, err := pgxpool.New(ctx, svctest.Postgres(t))
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			t.Cleanup(func() { pool.Exec(ctx, "DROP TABLE IF EXISTS idem_cli_"+suffix) })
			b, err := postgres.New(ctx, pool, postgres.Options{Table: "idem_cli_" + suffix})
			require.NoError(t, err)
			return b
		}},
		{"mysql", func(t testing.TB) string { return mysqlURL(svctest.MySQL(t)) }, "idem_cli_" + suffix, func(t *testing.T) backend.Backend {
			db, err := sql.Open("mysql", svctest.MySQL(t))
			require.NoError(t, err)
			t.Cleanup(func() { db.Close() })
			t.Cleanup(func() { db.Exec("DROP TABLE IF EXISTS idem_cli_" + suffix) })
			b, err := mysql.New(ctx, db, mysql.Options{Table: "idem_cli_" + suffix})
			require.NoError(t, err)
			return b
		}},
		{"redis", func(t testing.TB) string { return "redis://" + svctest.Redis(t) }, "idemcli:" + suffix + ":", func(t *testing.T) backend.Backend {
			rdb := goredis.NewClient(&goredis.Options{Addr: svctest.Redis(t)})
			t.Cleanup(func() { rdb.Close() })
			return redis.New(rdb, redis.Options{Prefix: "idemcli:" + suffix + ":"})
		}},
		{"sqlite", func(testing.TB) string { return "sqlite:" + sqlitePath }, "idem_cli", func(t *testing.T) backend.Backend {
			db, err := sqlite.Open(sqlitePath)
			require.NoError(t, err)
			t.Cleanup(func() { db.Close() })
			b, err := sqlite.New(ctx, db, sqlite.Options{Table: "idem_cli"})
			require.NoError(t, err)
			return b
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			where := tc.where(t) // or skip
			b := tc.backend(t)
			claimAt := time.Now()
			if tc.name == "sqlite" { // judged by the command's clock, not a server's
				claimAt = now.Add(-time.Minute)
			}
			_, _, err := b.Claim(ctx, dead, claimAt, time.Millisecond)
			require.NoError(t, err)
			for deadline := time.Now().Add(10 * time.Second); ; { // until the lease lapses by the server's clock
				rec, _, err := b.Get(ctx, dead.Key, time.Now())
				require.NoError(t, err)
				if rec.State == backend.StateInterrupted {
					break
				}
				require.True(t, time.Now().Before(deadline), "the lease never lapsed")
				time.Sleep(5 * time.Millisecond)
			}

			code, out, errs := runCmd("-name", tc.table, "inspect", where)
			require.Equal(t, 0, code, errs)
			assert.Contains(t, out, `"order-103"  interrupted`)
			code, out, errs = runCmd("-name", tc.table, "forget", where, "order-103")
			require.Equal(t, 0, code, errs)
			assert.Contains(t, out, "forgot")
			_, out, _ = runCmd("-name", tc.table, "inspect", where)
			assert.True(t, strings.HasSuffix(out, "0 record(s)\n"), out)

			// Killed again, and this time it did happen: resolve it as a
			// final error, which a late duplicate replays.
			_, _, err = b.Claim(ctx, dead, claimAt, time.Millisecond)
			require.NoError(t, err)
			for deadline := time.Now().Add(10 * time.Second); ; {
				rec, _, err := b.Get(ctx, dead.Key, time.Now())
				require.NoError(t, err)
				if rec.State == backend.StateInterrupted {
					break
				}
				require.True(t, time.Now().Before(deadline), "the lease never lapsed")
				time.Sleep(5 * time.Millisecond)
			}
			code, out, errs = runCmd("-name", tc.table, "resolve", where, "order-103", "-error", "out of stock")
			require.Equal(t, 0, code, errs)
			assert.Contains(t, out, "resolved")
			s := idem.New[int](idem.Options{Backend: b, Fingerprint: zeroFingerprint})
			defer s.Close()
			_, err = s.RunOnce(ctx, "order-103", "late", func(context.Context) (int, error) {
				t.Error("a resolved key ran again")
				return 0, nil
			})
			assert.True(t, idem.IsFinal(err), "%v", err)
			assert.EqualError(t, err, "out of stock")
		})
	}
}

// On a shared backend: a missing table names -name; a key whose lease
// holds says until when.
func TestSharedHints(t *testing.T) {
	ctx := context.Background()
	dsn := svctest.Postgres(t)
	code, _, errs := runCmd("inspect", dsn, "-name", "idem_no_such_table")
	assert.Equal(t, 1, code)
	assert.Contains(t, errs, `no table "idem_no_such_table"`)
	assert.Contains(t, errs, "-name")

	suffix := strconv.FormatInt(time.Now().UnixNano(), 36)
	pool, err := pgxpool.New(ctx, dsn)
	require.NoError(t, err)
	defer pool.Close()
	defer pool.Exec(ctx, "DROP TABLE IF EXISTS idem_hint_"+suffix)
	b, err := postgres.New(ctx, pool, postgres.Options{Table: "idem_hint_" + suffix})
	require.NoError(t, err)
	_, _, err = b.Claim(ctx, backend.Record{Key: "live", Token: "owner", State: backend.StatePending}, time.Now(), time.Hour)
	require.NoError(t, err)
	for _, cmd := range [][]string{{"forget"}, {"resolve", "-result", "1"}} {
		args := append([]string{cmd[0], dsn, "live", "-name", "idem_hint_" + suffix}, cmd[1:]...)
		code, _, errs = runCmd(args...)
		assert.Equal(t, 1, code, "%v", cmd)
		assert.Contains(t, errs, "lease holds until", "%v", cmd)
	}
}

// mysqlURL is dsn (user@tcp(host:port)/db) as the mysql:// URL the
// command takes, or "" when it does not parse.
func mysqlURL(dsn string) string {
	cfg, err := gomysql.ParseDSN(dsn)
	if err != nil {
		return ""
	}
	u := url.URL{Scheme: "mysql", Host: cfg.Addr, Path: "/" + cfg.DBName}
	if cfg.Passwd != "" {
		u.User = url.UserPassword(cfg.User, cfg.Passwd)
	} else if cfg.User != "" {
		u.User = url.User(cfg.User)
	}
	return u.String()
}

func TestMySQLURL(t *testing.T) {
	cfg, err := mysqlConfig("mysql://app:s3cret@db.internal/shop?parseTime=true")
	require.NoError(t, err)
	assert.Equal(t, "app", cfg.User)
	assert.Equal(t, "s3cret", cfg.Passwd)
	assert.Equal(t, "db.internal:3306", cfg.Addr)
	assert.Equal(t, "shop", cfg.DBName)
	assert.True(t, cfg.ParseTime)
	_, err = mysqlConfig("mysql://app:s3cret@db/shop?loc=Nowhere%2FAtAll")
	require.Error(t, err)
	assert.NotContains(t, err.Error(), "s3cret", "the password is not shown")
}
