package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"regexp"
	"strings"
	"time"

	gomysql "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/bolt"
	"github.com/seed094d4201/idem/postgres"
	"github.com/seed094d4201/idem/redis"
	"github.com/seed094d4201/idem/sqlite"
)

// A target is the backend a command works on, whatever it is.
type target = backend.Lister

// quiet drops go-redis's own log lines (a pool that cannot dial logs each
// try): the command reports the failure once, naming the address.
type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

// A clock reads the time of a shared backend's server, which judges its
// leases and expiries (PostgreSQL's clock_timestamp(), MySQL's NOW(6),
// Redis's TIME): the host that runs the command may be off.
type clock func(context.Context) (time.Time, error)

// openTarget opens where: a postgres:// or postgresql:// DSN, a mysql://
// URL, a redis:// URL, sqlite:PATH for a SQLite file, or else a bolt file, read-only if readOnly. name is the table
// (postgres, mysql, sqlite) or key prefix (redis); empty means the backend's default. It
// returns the server's clock for a shared backend (nil for a file, which
// this host's clock judges), and a func that closes what it opened. ctx
// bounds the connection.
func openTarget(ctx context.Context, where, name string, readOnly bool, w io.Writer) (target, clock, func(), error) {
	switch {
	case strings.HasPrefix(where, "postgres://"), strings.HasPrefix(where, "postgresql://"):
		cfg, err := pgxpool.ParseConfig(where)
		if err != nil { // pgx's message quotes the DSN, password and all
			return nil, nil, nil, fmt.Errorf("%s: not a DSN pgx can parse", display(where))
		}
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("%s: %w", display(where), err)
		}
		if err := pool.Ping(ctx); err != nil {
			pool.Close()
			return nil, nil, nil, fmt.Errorf("cannot reach PostgreSQL at %s:%d: %w", cfg.ConnConfig.Host, cfg.ConnConfig.Port, err)
		}
		// NoMigrate: an operator's tool never creates tables.
		b, err := postgres.New(ctx, pool, postgres.Options{Table: name, NoMigrate: true})
		if err != nil {
			pool.Close()
			return nil, nil, nil, err
		}
		now := func(ctx context.Context) (t time.Time, err error) {
			return t, pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&t)
		}
		return b, now, pool.Close, nil
	case strings.HasPrefix(where, "mysql://"):
		return openMySQL(ctx, where, name)
	case strings.HasPrefix(where, "redis://"), strings.HasPrefix(where, "rediss://"):
		opts, err := goredis.ParseURL(where)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("%s: not a Redis URL: %w", display(where), err)
		}
		goredis.SetLogger(quiet{})
		opts.MaxRetries = -1              // one try per call: the command bounds its own time
		opts.ContextTimeoutEnabled = true // and go-redis heeds ctx's deadline only when told
		if deadline, ok := ctx.Deadline(); ok {
			opts.DialTimeout = min(opts.DialTimeout, time.Until(deadline))
		}
		rdb := goredis.NewClient(opts)
		if err := rdb.Ping(ctx).Err(); err != nil {
			rdb.Close()
			return nil, nil, nil, fmt.Errorf("cannot reach Redis at %s: %w", opts.Addr, err)
		}
		now := func(ctx context.Context) (time.Time, error) { return rdb.Time(ctx).Result() }
		return redis.New(rdb, redis.Options{Prefix: name}), now, func() { rdb.Close() }, nil
	}
	if path, ok := strings.CutPrefix(where, "sqlite:"); ok {
		b, closeDB, err := openSQLite(ctx, path, name, readOnly)
		return b, nil, closeDB, err
	}
	// bolt.Open would create a missing file; an operator means an existing one.
	if _, err := os.Stat(where); err != nil {
		return nil, nil, nil, missingFile(where, err)
	}
	// An operator's tool reads the whole file first, however it was closed:
	// it is what is run on a file someone doubts.
	b, err := bolt.Open(where, &bolt.Options{ReadOnly: readOnly, Check: bolt.CheckAlways})
	if errors.Is(err, bolt.ErrLocked) {
		return nil, nil, nil, fmt.Errorf("%w (is the service that uses it still running?)", err)
	}
	if err != nil {
		return nil, nil, nil, err
	}
	if n := b.Interrupted(); n > 0 {
		fmt.Fprintf(w, "note: %d key(s) were left in flight by a process that stopped; they are now interrupted\n", n)
	}
	return b, nil, func() { b.Close() }, nil
}

// openSQLite opens the SQLite file at path, which must exist, read-only if
// readOnly; its table must exist too.
func openSQLite(ctx context.Context, path, name string, readOnly bool) (target, func(), error) {
	if _, err := os.Stat(path); err != nil {
		return nil, nil, err
	}
	var db *sql.DB
	var err error
	if readOnly {
		db, err = sqlite.OpenReadOnly(ctx, path)
	} else {
		db, err = sqlite.Open(path)
	}
	if err != nil {
		return nil, nil, err
	}
	// NoMigrate: an operator's tool never creates tables.
	b, err := sqlite.New(ctx, db, sqlite.Options{Table: name, NoMigrate: true})
	if err != nil {
		db.Close()
		return nil, nil, err
	}
	return b, func() { db.Close() }, nil
}

// missingFile is the error of a WHERE that names no file, shown as
// display shows it: a PostgreSQL DSN in keyword/value form (host=...
// password=...), which idem does not take, lands here, and os.Stat's
// error quoted it whole, password and all.
func missingFile(where string, err error) error {
	var pe *os.PathError
	if !errors.As(err, &pe) {
		return err
	}
	err = fmt.Errorf("%s: %w", display(where), pe.Err)
	if strings.Contains(where, "=") {
		err = fmt.Errorf("%w (a PostgreSQL DSN is given as a postgres:// URL)", err)
	}
	return err
}

// keywordPassword is a password in a keyword/value DSN: the value, bare
// or single-quoted, of the keyword password.
var keywordPassword = regexp.MustCompile(`(?i)(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|\S*)`)

// display returns where as it may be shown: a URL's password, in its user
// part or as a password parameter, is redacted, and a URL that does not
// parse is not shown at all, since it may hold one; so is the password
// of what reads as a keyword/value DSN.
func display(where string) string {
	scheme, _, isURL := strings.Cut(where, "://")
	if !isURL {
		return keywordPassword.ReplaceAllString(where, "${1}xxxxx") // a file, or a DSN taken for one
	}
	u, err := url.Parse(where)
	if err != nil {
		return scheme + "://(a URL that does not parse)"
	}
	if q := u.Query(); q.Has("password") {
		q.Set("password", "xxxxx")
		u.RawQuery = q.Encode()
	}
	return u.Redacted()
}

// explain adds the next step to errors an operator can act on.
func explain(err error, name string) error {
	var pgErr *pgconn.PgError
	var myErr *gomysql.MySQLError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" || // undefined_table
		errors.As(err, &myErr) && myErr.Number == 1146 || // ER_NO_SUCH_TABLE
		err != nil && strings.Contains(err.Error(), "no such table") {
		table := name
		if table == "" {
			table = "idem_keys"
		}
		return fmt.Errorf("no table %q in this database: give the store's table with -name (%w)", table, err)
	}
	return err
}
