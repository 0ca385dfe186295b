package main

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"strings"
	"time"

	gomysql "github.com/go-sql-driver/mysql"
	"github.com/seed094d4201/idem/mysql"
)

// mysqlConfig turns a mysql:// URL (mysql://user:password@host:port/db?param=v,
// the parameters those of github.com/go-sql-driver/mysql) into the
// driver's configuration.
func mysqlConfig(where string) (*gomysql.Config, error) {
	u, err := url.Parse(where)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("%s: not a MySQL URL (mysql://user:password@host:3306/database)", display(where))
	}
	host := u.Host
	if u.Port() == "" {
		host += ":3306"
	}
	// The driver's DSN has no escapes: a ':' in the user name would move
	// into the password, a '?' in the database name would cut it short.
	// So the DSN carries the address and the parameters alone (which the
	// driver reads as it documents, TLS's server name from the address
	// included), and the URL's decoded parts are set as they are.
	dsn := "tcp(" + host + ")/"
	if u.RawQuery != "" {
		dsn += "?" + u.RawQuery
	}
	cfg, err := gomysql.ParseDSN(dsn)
	if err != nil { // its message may quote the DSN, password and all
		return nil, fmt.Errorf("%s: not a DSN the MySQL driver takes", display(where))
	}
	if u.User != nil {
		cfg.User = u.User.Username()
		cfg.Passwd, _ = u.User.Password()
	}
	cfg.DBName = strings.TrimPrefix(u.Path, "/")
	return cfg, nil
}

// openMySQL opens the table name (default idem_keys) at where, a mysql://
// URL; the table must exist. It returns the server's clock too.
func openMySQL(ctx context.Context, where, name string) (target, clock, func(), error) {
	cfg, err := mysqlConfig(where)
	if err != nil {
		return nil, nil, nil, err
	}
	connector, err := gomysql.NewConnector(cfg)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("%s: %w", display(where), err)
	}
	db := sql.OpenDB(connector)
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, nil, nil, fmt.Errorf("cannot reach MySQL at %s: %w", cfg.Addr, err)
	}
	// NoMigrate: an operator's tool never creates tables.
	b, err := mysql.New(ctx, db, mysql.Options{Table: name, NoMigrate: true})
	if err != nil {
		db.Close()
		return nil, nil, nil, err
	}
	return b, mysqlNow(db), func() { db.Close() }, nil
}

// mysqlNow is the clock of db's server: microseconds since 1970 by its
// NOW(6), whatever the session's time_zone or the driver's parseTime
// and loc.
func mysqlNow(db *sql.DB) clock {
	return func(ctx context.Context) (time.Time, error) {
		var us int64
		err := db.QueryRowContext(ctx, `SELECT CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS SIGNED)`).Scan(&us)
		return time.UnixMicro(us), err
	}
}
