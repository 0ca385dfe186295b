package mysql

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"
)

// maxIdentifier is the longest name MySQL and MariaDB take for a database
// or a table, in characters (they refuse longer ones; the test is on
// bytes, which is stricter).
const maxIdentifier = 64

// quoteTable returns name, optionally database-qualified ("billing.keys"),
// as SQL: each part quoted with backticks.
func quoteTable(name string) (string, error) {
	parts := strings.Split(name, ".")
	if len(parts) > 2 {
		return "", fmt.Errorf("mysql: table name %q: at most one dot, between database and table", name)
	}
	for i, part := range parts {
		switch {
		case part == "":
			return "", fmt.Errorf("mysql: table name %q has an empty part", name)
		case len(part) > maxIdentifier:
			return "", fmt.Errorf("mysql: table name %q: %q is longer than MySQL's %d", name, part, maxIdentifier)
		case strings.ContainsAny(part, "`\x00") || strings.TrimRight(part, " ") != part:
			// A backtick could be doubled, but MySQL refuses names that
			// end in a space and NUL everywhere: refuse them all here.
			return "", fmt.Errorf("mysql: table name %q: backtick, NUL or trailing space", name)
		}
		parts[i] = "`" + part + "`"
	}
	return strings.Join(parts, "."), nil
}

// createTableSQL creates the table, if absent: Schema for any name.
func createTableSQL(table string) string {
	return `CREATE TABLE IF NOT EXISTS ` + table + ` (
    ` + "`key`" + `       VARBINARY(255) NOT NULL,
    fingerprint BINARY(32)     NOT NULL,
    token       VARBINARY(255) NOT NULL,
    state       TINYINT        NOT NULL,
    created_at  DATETIME(6)    NOT NULL,
    expires_at  DATETIME(6)    NULL,
    lease_until DATETIME(6)    NULL,
    value       LONGBLOB       NULL,
    failed      BOOLEAN        NOT NULL,
    err_msg     LONGBLOB       NOT NULL,
    steps       LONGBLOB       NULL,
    PRIMARY KEY (` + "`key`" + `),
    INDEX sweep (expires_at)
) ENGINE = InnoDB;`
}

// lockName is the GET_LOCK name of table's migration: at most 64
// characters, which MySQL 5.7 and later require.
func lockName(table string) string {
	name := "idem migrate " + table
	if len(name) <= maxIdentifier {
		return name
	}
	return fmt.Sprintf("idem migrate %x", sha256.Sum256([]byte(table)))[:maxIdentifier]
}

// migrate creates the table if it is absent, under a named lock
// (GET_LOCK), so that replicas starting together take turns, and on a
// connection of its own, never in a transaction: DDL commits whatever
// transaction its session has open. It asks the catalog first, so that
// replicas starting beside a busy table send it no DDL at all.
func migrate(ctx context.Context, db *sql.DB, table, name string) error {
	conn, err := db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	lock := lockName(table)
	// GET_LOCK waits at most its timeout, in seconds, and says 0 when
	// that passes: asked again until ctx ends, so that a replica stuck
	// in its migration holds the others up only as long as their ctx.
	for {
		var got sql.NullInt64
		if err := conn.QueryRowContext(ctx, `SELECT GET_LOCK(?, 1)`, lock).Scan(&got); err != nil {
			return err
		}
		if got.Valid && got.Int64 == 1 {
			break
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("waiting for the migration lock %q: %w", lock, err)
		}
	}
	defer conn.ExecContext(context.WithoutCancel(ctx), `DO RELEASE_LOCK(?)`, lock)
	var exists bool
	if err := conn.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM information_schema.TABLES
    WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ?)`, schemaOf(name), tableOf(name)).Scan(&exists); err != nil {
		return err
	}
	if exists {
		return nil
	}
	_, err = conn.ExecContext(ctx, createTableSQL(table))
	return err
}

// checkUniqueKey refuses a table that exists without a unique index on
// `key` alone, whole: a claim is an INSERT that only a duplicate key
// refuses, so without one every claim of a key would win (a table made by
// other tools, or restored by CREATE TABLE ... AS SELECT, which drops
// keys). A table that does not exist yet (Options.NoMigrate) is not
// checked: its first claim fails until it does.
func checkUniqueKey(ctx context.Context, db *sql.DB, name string) error {
	var tables, unique int
	err := db.QueryRowContext(ctx, `SELECT
    (SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ?),
    (SELECT COUNT(*) FROM (SELECT INDEX_NAME FROM information_schema.STATISTICS
        WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ? AND NON_UNIQUE = 0
        GROUP BY INDEX_NAME
        HAVING COUNT(*) = 1 AND MAX(COLUMN_NAME) = 'key' AND MAX(SUB_PART) IS NULL) u)`,
		schemaOf(name), tableOf(name), schemaOf(name), tableOf(name)).Scan(&tables, &unique)
	switch {
	case err != nil:
		return fmt.Errorf("reading its indexes: %w", err)
	case tables > 0 && unique == 0:
		return errors.New("no unique index on `key` alone (its PRIMARY KEY in Schema): every claim of a key would win")
	}
	return nil
}

// schemaOf is the database part of a qualified table name, or nil.
func schemaOf(name string) any {
	if db, _, ok := strings.Cut(name, "."); ok {
		return db
	}
	return nil
}

// tableOf is the table part of a table name.
func tableOf(name string) string {
	if _, t, ok := strings.Cut(name, "."); ok {
		return t
	}
	return name
}

// pause waits d, or until ctx ends.
func pause(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
