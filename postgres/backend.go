// Package postgres is an idem.Backend in a PostgreSQL table, shared by every
// process and machine that uses the same database.
//
// A claim is one INSERT ... ON CONFLICT DO NOTHING statement that returns
// the standing record if it loses, so the table's primary key decides,
// atomically, which of many concurrent claims wins, and a replay writes
// nothing. An expired record is taken over by one conditional UPDATE. Complete, Release and Renew compare
// the claim's token in their WHERE clause, so a stale owner can never write
// over a newer claim. Expiry uses the clocks of the processes that call it:
// keep them in sync (NTP), as leases and TTLs are compared across machines.
//
// RunOnceTx is the transactional mode: the key, the caller's own writes and
// the outcome commit in one transaction.
package postgres

import (
	"context"
	_ "embed"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/seed094d4201/idem"
)

// Schema is the SQL that creates the default table, idem_keys: the file
// schema.sql, for migration tools.
//
//go:embed schema.sql
var Schema string

// Options configure a Backend. The zero value is ready to use.
type Options struct {
	// Table names the table, optionally schema-qualified ("billing.keys").
	// Empty means "idem_keys".
	Table string

	// NoMigrate leaves the schema alone: the table must already exist, as
	// Schema creates it. False means New creates the table and its index if
	// they are absent.
	NoMigrate bool
}

// Backend is an idem.Backend over a PostgreSQL table. It is safe for
// concurrent use by many goroutines and processes.
type Backend struct {
	pool *pgxpool.Pool
	q    queries
}

var _ idem.Backend = (*Backend)(nil)

// New returns a Backend over pool, creating its table unless opts.NoMigrate.
// The caller keeps ownership of pool and closes it after the Stores that use
// the Backend.
func New(ctx context.Context, pool *pgxpool.Pool, opts Options) (*Backend, error) {
	name := opts.Table
	if name == "" {
		name = "idem_keys"
	}
	table := pgx.Identifier(strings.Split(name, ".")).Sanitize()
	b := &Backend{pool: pool, q: newQueries(table)}
	if !opts.NoMigrate {
		index := pgx.Identifier{strings.ReplaceAll(name, ".", "_") + "_expiry"}.Sanitize()
		if _, err := pool.Exec(ctx, createSQL(table, index)); err != nil {
			return nil, fmt.Errorf("postgres: creating table %s: %w", table, err)
		}
	}
	return b, nil
}

// createSQL is Schema for any table and index name.
func createSQL(table, index string) string {
	return `CREATE TABLE IF NOT EXISTS ` + table + ` (
    key         text        PRIMARY KEY,
    fingerprint bytea       NOT NULL,
    token       text        NOT NULL,
    state       smallint    NOT NULL,
    created_at  timestamptz NOT NULL,
    expires_at  timestamptz,
    lease_until timestamptz,
    value       bytea,
    failed      boolean     NOT NULL DEFAULT false,
    err_msg     text        NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS ` + index + ` ON ` + table + ` (expires_at) WHERE state = 2;`
}

// queries are the statements, written once for the table's name.
type queries struct {
	claim, takeOver, complete, release, renew, get, forget, exists, sweep, all string
}

const columns = `key, fingerprint, token, state, created_at, expires_at, lease_until, value, failed, err_msg`

func newQueries(t string) queries {
	return queries{
		// One round trip: insert the claim, or return the record that
		// stands. DO NOTHING takes no lock on a conflicting row, so a replay
		// writes nothing and costs no WAL flush. If a concurrent claim
		// committed after this statement's snapshot, neither branch yields
		// a row, and Claim runs it again.
		claim: `WITH claimed AS (
    INSERT INTO ` + t + ` (key, fingerprint, token, state, created_at, lease_until)
    VALUES ($1, $2, $3, 1, $4, $5)
    ON CONFLICT (key) DO NOTHING
    RETURNING ` + columns + `)
SELECT true, ` + columns + ` FROM claimed
UNION ALL
SELECT false, ` + columns + ` FROM ` + t + ` WHERE key = $1 AND NOT EXISTS (SELECT 1 FROM claimed)`,
		// Takes over a record that expired, atomically: the WHERE clause is
		// checked against the row as it stands when the UPDATE locks it.
		takeOver: `UPDATE ` + t + ` SET fingerprint = $2, token = $3, state = 1, created_at = $4, expires_at = NULL,
    lease_until = $5, value = NULL, failed = false, err_msg = ''
WHERE key = $1 AND state = 2 AND expires_at <= $6
RETURNING true, ` + columns,
		complete: `UPDATE ` + t + ` SET fingerprint = $3, state = 2, created_at = $4, expires_at = $5, lease_until = NULL,
    value = $6, failed = $7, err_msg = $8
WHERE key = $1 AND token = $2 AND state <> 2`,
		release: `DELETE FROM ` + t + ` WHERE key = $1 AND token = $2 AND state <> 2`,
		renew: `UPDATE ` + t + ` SET lease_until = $3
WHERE key = $1 AND token = $2 AND state = 1 AND (lease_until IS NULL OR lease_until > $4)`,
		get: `SELECT ` + columns + ` FROM ` + t + ` WHERE key = $1`,
		all: `SELECT ` + columns + ` FROM ` + t + ` ORDER BY key`,
		forget: `DELETE FROM ` + t + ` WHERE key = $1
    AND NOT (state = 1 AND (lease_until IS NULL OR lease_until > $2))`,
		exists: `SELECT EXISTS (SELECT 1 FROM ` + t + ` WHERE key = $1)`,
		sweep: `DELETE FROM ` + t + ` WHERE key IN (
    SELECT key FROM ` + t + ` WHERE state = 2 AND expires_at <= $1
    ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED)`,
	}
}

func (b *Backend) Claim(ctx context.Context, rec idem.Record, now time.Time) (idem.Record, bool, error) {
	args := []any{rec.Key, rec.Fingerprint[:], rec.Token, rec.CreatedAt, nullTime(rec.LeaseUntil)}
	for {
		rows, err := b.pool.Query(ctx, b.q.claim, args...)
		if err != nil {
			return idem.Record{}, false, err
		}
		var won bool
		got, found, err := scanOne(rows, &won)
		switch {
		case err != nil:
			return idem.Record{}, false, err
		case found && !got.Expired(now):
			return got, won, nil
		case found: // expired: take it over, unless another claim did first
			if rows, err = b.pool.Query(ctx, b.q.takeOver, append(args, now)...); err != nil {
				return idem.Record{}, false, err
			}
			if got, found, err = scanOne(rows, &won); err != nil || found {
				return got, won, err
			}
		}
		if err := ctx.Err(); err != nil {
			return idem.Record{}, false, err
		}
	}
}

func (b *Backend) Complete(ctx context.Context, rec idem.Record) error {
	tag, err := b.pool.Exec(ctx, b.q.complete, rec.Key, rec.Token, rec.Fingerprint[:], rec.CreatedAt,
		nullTime(rec.ExpiresAt), rec.Value, rec.Failed, rec.ErrMsg)
	return owned(tag, err, rec.Key)
}

func (b *Backend) Release(ctx context.Context, key, token string) error {
	tag, err := b.pool.Exec(ctx, b.q.release, key, token)
	return owned(tag, err, key)
}

func (b *Backend) Renew(ctx context.Context, key, token string, now, until time.Time) error {
	tag, err := b.pool.Exec(ctx, b.q.renew, key, token, until, now)
	return owned(tag, err, key)
}

// owned turns a token-guarded write that changed no row into ErrNotOwner.
func owned(tag pgconn.CommandTag, err error, key string) error {
	switch {
	case err != nil:
		return err
	case tag.RowsAffected() == 0:
		return fmt.Errorf("%w: key %q", idem.ErrNotOwner, key)
	}
	return nil
}

func (b *Backend) Get(ctx context.Context, key string) (idem.Record, bool, error) {
	rows, err := b.pool.Query(ctx, b.q.get, key)
	if err != nil {
		return idem.Record{}, false, err
	}
	return scanOne(rows)
}

func (b *Backend) Forget(ctx context.Context, key string, now time.Time) error {
	tag, err := b.pool.Exec(ctx, b.q.forget, key, now)
	if err != nil || tag.RowsAffected() > 0 {
		return err
	}
	var exists bool
	if err := b.pool.QueryRow(ctx, b.q.exists, key).Scan(&exists); err != nil {
		return err
	}
	if exists {
		return fmt.Errorf("%w: key %q is claimed and its lease holds", idem.ErrInProgress, key)
	}
	return nil
}

func (b *Backend) Sweep(ctx context.Context, now time.Time, limit int) (int, error) {
	tag, err := b.pool.Exec(ctx, b.q.sweep, now, limit)
	if err != nil {
		return 0, err
	}
	return int(tag.RowsAffected()), nil
}

// scanOne reads the one record rows may hold, after any leading columns
// given as extra destinations, and closes rows.
func scanOne(rows pgx.Rows, extra ...any) (idem.Record, bool, error) {
	defer rows.Close()
	return scanNext(rows, extra...)
}

// scanNext reads the next record of rows, if there is one.
func scanNext(rows pgx.Rows, extra ...any) (idem.Record, bool, error) {
	if !rows.Next() {
		return idem.Record{}, false, rows.Err()
	}
	var rec idem.Record
	var fp []byte
	var state int16
	var expires, lease *time.Time
	dest := append(extra, &rec.Key, &fp, &rec.Token, &state, &rec.CreatedAt, &expires, &lease, &rec.Value, &rec.Failed, &rec.ErrMsg)
	if err := rows.Scan(dest...); err != nil {
		return idem.Record{}, false, err
	}
	if len(fp) != len(rec.Fingerprint) {
		return idem.Record{}, false, fmt.Errorf("postgres: key %q: fingerprint of %d bytes", rec.Key, len(fp))
	}
	copy(rec.Fingerprint[:], fp)
	rec.State = idem.RecordState(state)
	if expires != nil {
		rec.ExpiresAt = *expires
	}
	if lease != nil {
		rec.LeaseUntil = *lease
	}
	return rec, true, rows.Err()
}

// nullTime is t, or SQL NULL for the zero Time.
func nullTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// Each calls fn for every record, in key order, stopping at fn's first
// error. It is for inspection (cmd/idem): it reads the whole table.
func (b *Backend) Each(ctx context.Context, fn func(idem.Record) error) error {
	rows, err := b.pool.Query(ctx, b.q.all)
	if err != nil {
		return err
	}
	defer rows.Close()
	for {
		rec, ok, err := scanNext(rows)
		if err != nil || !ok {
			return err
		}
		if err := fn(rec); err != nil {
			return err
		}
	}
}
