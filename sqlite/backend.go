// Package sqlite is a backend.Backend in a SQLite table: embedded like
// package bolt, but shared by every process that opens the same file, and
// next to the application's own tables, so that RunOnceTx can commit the
// key, the caller's writes and the outcome in one transaction.
//
// A claim is one INSERT ... ON CONFLICT DO NOTHING statement: SQLite's
// single writer decides, atomically, which of many concurrent claims
// (from any goroutine or process) wins. Complete, Release and Renew
// compare the claim's token in their WHERE clause, so a stale owner can
// never write over a newer claim.
//
// A process's writes share transactions: while one is built or committed,
// the writes that arrive queue for the next, which commits them all with
// one fsync (16 callers make about 3.7 times the new keys a second that
// they made one commit each: bench/README.md). A caller that leaves while
// its write is queued is refused with nothing written; one that failed is
// taken back with its whole transaction, and the others are run again
// without it. RunOnceTx keeps a transaction of its own.
//
// Time is the Store's clock (Options.Now), as for bolt: every process that
// shares the file runs on the same machine, so they share a clock. A claim
// whose lease lapsed (its process died, or stopped renewing) is reported
// interrupted.
//
// Open sets the database up as the Backend needs it (WAL, fsync at every
// commit, a busy timeout). The tested driver is modernc.org/sqlite, pure
// Go; New takes any *sql.DB, so another driver works when its DSN sets the
// same.
package sqlite

import (
	"context"
	"database/sql"
	_ "embed"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/internal/paging"
)

// Schema is the SQL that creates the default table, idem_keys: the file
// schema.sql, for migration tools.
//
//go:embed schema.sql
var Schema string

// Options configure a Backend. The zero value is ready to use.
type Options struct {
	// Table names the table. Empty means "idem_keys".
	Table string

	// NoMigrate leaves the schema alone: the table must already exist, as
	// Schema creates it. False means New creates the table and its index if
	// they are absent.
	NoMigrate bool
}

// Backend is a backend.Backend over a SQLite table. It is safe for
// concurrent use by many goroutines and processes.
type Backend struct {
	db    *sql.DB
	table string
	q     queries

	// write is a one-slot semaphore, the process's write turn: the
	// committer takes it for each shared transaction, RunOnceTx and the
	// migration for their own. They queue here, where a waiter wakes as
	// soon as the lock is free and its ctx can end the wait, rather than
	// in SQLite's busy handler, which sleeps in steps of up to 100 ms.
	// Writes from other processes still meet in the busy handler.
	write chan struct{}

	qmu        sync.Mutex
	queue      []*writeReq // guarded by qmu; the writes waiting for the committer, in order
	committing bool        // guarded by qmu; whether a committer is running (it ends when queue is empty)
	solo       int         // the committer's own: how many transactions to run of one write each

	mu    sync.Mutex
	stmts map[string]*sql.Stmt // guarded by mu; statements prepared so far, by their SQL

	// wal: the database was in WAL mode at New, where a read never waits
	// for another's lock (see Get). Written once, in New.
	wal bool
}

var _ backend.Lister = (*Backend)(nil)

// New returns a Backend over db, creating its table unless opts.NoMigrate,
// and putting the file in WAL mode. db must have a busy timeout (Open sets
// one): without it, a write that meets another process's lock fails at
// once. The caller keeps ownership of db and closes it after the Stores
// that use the Backend.
func New(ctx context.Context, db *sql.DB, opts Options) (*Backend, error) {
	if db == nil {
		return nil, errors.New("sqlite: New with a nil *sql.DB")
	}
	table := opts.Table
	if table == "" {
		table = "idem_keys"
	}
	b := &Backend{db: db, table: table, q: newQueries(quote(table)), write: make(chan struct{}, 1), stmts: map[string]*sql.Stmt{}}
	var busy int64
	if err := db.QueryRowContext(ctx, `PRAGMA busy_timeout`).Scan(&busy); err != nil {
		return nil, fmt.Errorf("sqlite: %w", closedErr(err))
	}
	if busy <= 0 {
		return nil, errors.New("sqlite: the database has no busy timeout, so a write that meets another's lock would fail at once: open it with sqlite.Open, or set busy_timeout in the driver's DSN")
	}
	var seq int
	var schema, file string
	if err := db.QueryRowContext(ctx, `PRAGMA database_list`).Scan(&seq, &schema, &file); err != nil {
		return nil, fmt.Errorf("sqlite: %w", closedErr(err))
	}
	if file == "" {
		return nil, errors.New("sqlite: an in-memory database keeps nothing, and each pooled connection gets one of its own: use a file")
	}
	if !opts.NoMigrate {
		if err := setWAL(ctx, db); err != nil {
			return nil, fmt.Errorf("sqlite: %w", err)
		}
		// In a transaction whose first statement writes, so that it holds
		// the write lock from the start: processes starting together take
		// turns, and each finds the table the one before it made.
		if err := b.inTx(ctx, func(tx *sql.Tx) error {
			if _, err := tx.ExecContext(ctx, createSQL(quote(table), quote(table+"_expiry"))); err != nil {
				return err
			}
			return addStepsColumn(ctx, tx, table)
		}); err != nil {
			return nil, fmt.Errorf("sqlite: creating table %s: %w", table, err)
		}
	}
	// A database left in a rollback journal (NoMigrate, a schema made by
	// other tools) has readers wait for a writer's lock: Get must then
	// watch its ctx.
	var mode string
	if err := db.QueryRowContext(ctx, `PRAGMA journal_mode`).Scan(&mode); err != nil {
		return nil, fmt.Errorf("sqlite: %w", closedErr(err))
	}
	b.wal = strings.EqualFold(mode, "wal")
	// Prepared now, on the pool: a statement first prepared inside a
	// transaction would wait for a second connection, which a pool of one
	// (SetMaxOpenConns(1)) never has.
	for _, q := range b.q.all() {
		if _, err := b.prepared(ctx, q); err != nil {
			return nil, fmt.Errorf("sqlite: table %s: %w", table, err)
		}
	}
	return b, nil
}

// addStepsColumn adds the steps column to a table made before steps.
func addStepsColumn(ctx context.Context, tx *sql.Tx, table string) error {
	var has bool
	err := tx.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM pragma_table_info(?1) WHERE name = 'steps')`, table).Scan(&has)
	if err != nil || has {
		return err
	}
	_, err = tx.ExecContext(ctx, `ALTER TABLE `+quote(table)+` ADD COLUMN steps BLOB`)
	return err
}

// quote makes name an SQL identifier.
func quote(name string) string {
	return `"` + strings.ReplaceAll(name, `"`, `""`) + `"`
}

// createSQL is Schema for any table and index name.
func createSQL(table, index string) string {
	return `CREATE TABLE IF NOT EXISTS ` + table + ` (
    key         TEXT    PRIMARY KEY NOT NULL,
    fingerprint BLOB    NOT NULL,
    token       TEXT    NOT NULL,
    state       INTEGER NOT NULL,
    created_at  INTEGER NOT NULL,
    expires_at  INTEGER,
    lease_until INTEGER,
    value       BLOB,
    failed      INTEGER NOT NULL DEFAULT 0,
    err_msg     TEXT    NOT NULL DEFAULT '',
    steps       BLOB
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS ` + index + ` ON ` + table + ` (expires_at) WHERE state = 2;`
}

// queries are the statements, written once for the table's name. Instants
// are Unix nanoseconds, given as parameters from the Store's clock.
type queries struct {
	claim, takeOver, complete, release, renew, get, forget, exists, sweep, each string
	setSteps, resume                                                            string
}

// all returns every statement.
func (q queries) all() []string {
	return []string{q.claim, q.takeOver, q.complete, q.release, q.renew, q.get, q.forget, q.exists, q.sweep, q.each, q.setSteps, q.resume}
}

const columns = `key, fingerprint, token, state, created_at, expires_at, lease_until, value, failed, err_msg, steps`

func newQueries(t string) queries {
	return queries{
		// Inserts the claim or does nothing; RETURNING yields a row only
		// for the claim that won.
		claim: `INSERT INTO ` + t + ` (key, fingerprint, token, state, created_at, lease_until) VALUES (?1, ?2, ?3, 1, ?4, ?5)
ON CONFLICT (key) DO NOTHING RETURNING ` + columns,
		// Takes over a record that expired at ?4, atomically: the WHERE
		// clause is checked under the write lock.
		takeOver: `UPDATE ` + t + ` SET fingerprint = ?2, token = ?3, state = 1, created_at = ?4, expires_at = NULL,
    lease_until = ?5, value = NULL, failed = 0, err_msg = '', steps = NULL
WHERE key = ?1 AND state = 2 AND expires_at <= ?4 RETURNING ` + columns,
		complete: `UPDATE ` + t + ` SET state = 2, expires_at = ?3, lease_until = NULL, value = ?4, failed = ?5, err_msg = ?6
WHERE key = ?1 AND token = ?2 AND state <> 2`,
		release: `DELETE FROM ` + t + ` WHERE key = ?1 AND token = ?2 AND state <> 2`,
		renew:   `UPDATE ` + t + ` SET lease_until = ?3 WHERE key = ?1 AND token = ?2 AND state = 1`,
		get:     `SELECT ` + columns + ` FROM ` + t + ` WHERE key = ?1`,
		each:    `SELECT ` + columns + ` FROM ` + t + ` WHERE key > ?1 ORDER BY key LIMIT ?2`,
		// Both under the write lock, after a read of the record in the
		// same transaction; the WHERE clause compares the token again.
		setSteps: `UPDATE ` + t + ` SET steps = ?3 WHERE key = ?1 AND token = ?2 AND state = 1 AND (lease_until IS NULL OR lease_until > ?4)`,
		resume:   `UPDATE ` + t + ` SET token = ?3, state = 1, lease_until = ?4 WHERE key = ?1 AND token = ?2 RETURNING ` + columns,
		forget: `DELETE FROM ` + t + ` WHERE key = ?1
    AND NOT (state = 1 AND (lease_until IS NULL OR lease_until > ?2))`,
		exists: `SELECT EXISTS (SELECT 1 FROM ` + t + ` WHERE key = ?1)`,
		sweep: `DELETE FROM ` + t + ` WHERE key IN (
    SELECT key FROM ` + t + ` WHERE state = 2 AND expires_at <= ?1 ORDER BY expires_at LIMIT ?2)`,
	}
}

// nanos is t as stored: Unix nanoseconds, or NULL for the zero Time.
func nanos(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t.UnixNano()
}

// Claim claims rec.Key, in a transaction it may share with other writes:
// the insert that wins, or the record that stands, taken over if it
// expired at now.
func (b *Backend) Claim(ctx context.Context, rec backend.Record, now time.Time, lease time.Duration) (backend.Record, bool, error) {
	if err := ctx.Err(); err != nil {
		// Nothing sent: a refusal (backend.ErrRefused), which the Store
		// need not read back.
		return backend.Record{}, false, backend.Refuse(err)
	}
	// Most claims of a known key are replays: answer them from a read,
	// which takes no lock.
	if old, ok, err := b.Get(ctx, rec.Key, now); err != nil {
		// A read wrote nothing: a refusal, whatever failed it (a ctx that
		// ended while it waited for a connection, say).
		return backend.Record{}, false, backend.Refuse(err)
	} else if ok {
		return old, false, nil
	}
	var leaseUntil time.Time
	if lease > 0 {
		leaseUntil = now.Add(lease)
	}
	var got backend.Record
	won := false
	err := b.do(ctx, func(ctx context.Context, tx *sql.Tx) (err error) {
		got, won, err = b.claimIn(ctx, tx, rec.Key, rec.Fingerprint, rec.Token, now, leaseUntil)
		return err
	})
	if err != nil {
		return backend.Record{}, false, err
	}
	if !won {
		got, _ = got.SeenAt(now) // a lapsed lease shows as interrupted
	}
	return got, won, nil
}

// claimIn claims key inside tx, whose first statement this is, or returns
// the record that stands. Under the write lock nothing else changes the
// table between its statements.
func (b *Backend) claimIn(ctx context.Context, tx *sql.Tx, key string, fp [32]byte, token string, now, leaseUntil time.Time) (backend.Record, bool, error) {
	args := []any{key, fp[:], token, now.UnixNano(), nanos(leaseUntil)}
	rec, found, err := scanOne(b.query(ctx, tx, b.q.claim, args...))
	if err != nil || found {
		return rec, found, err
	}
	if rec, found, err = scanOne(b.query(ctx, tx, b.q.get, key)); err != nil {
		return backend.Record{}, false, err
	}
	if !found {
		return backend.Record{}, false, fmt.Errorf("sqlite: key %q: the insert found a row the read does not", key)
	}
	if !rec.Expired(now) {
		return rec, false, nil
	}
	rec, found, err = scanOne(b.query(ctx, tx, b.q.takeOver, args...))
	if err == nil && !found {
		err = fmt.Errorf("sqlite: key %q: an expired record could not be taken over", key)
	}
	return rec, found, err
}

// Complete records the outcome, expiring ttl after now.
func (b *Backend) Complete(ctx context.Context, rec backend.Record, now time.Time, ttl time.Duration) error {
	n, err := b.exec(ctx, b.q.complete, rec.Key, rec.Token, now.Add(ttl).UnixNano(), rec.Value, rec.Failed, rec.ErrMsg)
	return backend.Owned(n, err, rec.Key)
}

func (b *Backend) Release(ctx context.Context, key, token string) error {
	n, err := b.exec(ctx, b.q.release, key, token)
	return backend.Owned(n, err, key)
}

func (b *Backend) Renew(ctx context.Context, key, token string, now time.Time, lease time.Duration) error {
	n, err := b.exec(ctx, b.q.renew, key, token, now.Add(lease).UnixNano())
	return backend.Owned(n, err, key)
}

func (b *Backend) Get(ctx context.Context, key string, now time.Time) (backend.Record, bool, error) {
	if err := ctx.Err(); err != nil {
		return backend.Record{}, false, backend.Refuse(err)
	}
	// One read of one row, which never waits for a lock in WAL mode: not
	// worth the goroutines that database/sql and the driver start to
	// watch a ctx that can end, which cost more than the read itself. But
	// on a pool with a bound (db.SetMaxOpenConns) the read may wait for a
	// connection, which a write holds for as long as another process keeps
	// the write lock, and in a rollback journal it waits in the busy
	// handler while a writer holds the file: then ctx must end the wait.
	if b.wal && b.db.Stats().MaxOpenConnections == 0 {
		ctx = context.WithoutCancel(ctx)
	}
	rec, found, err := scanOne(b.query(ctx, nil, b.q.get, key))
	if err != nil || !found {
		return backend.Record{}, false, closedErr(err)
	}
	rec, found = rec.SeenAt(now)
	return rec, found, nil
}

func (b *Backend) Forget(ctx context.Context, key string, now time.Time) error {
	n, err := b.exec(ctx, b.q.forget, key, now.UnixNano())
	if err != nil || n > 0 {
		return err
	}
	st, err := b.prepared(ctx, b.q.exists)
	if err != nil {
		return err
	}
	var exists bool
	if err := st.QueryRowContext(ctx, key).Scan(&exists); err != nil {
		return closedErr(err)
	}
	if exists {
		return fmt.Errorf("%w: key %q is claimed and its lease holds", idem.ErrInProgress, key)
	}
	return nil
}

func (b *Backend) Sweep(ctx context.Context, now time.Time, limit int) (int, error) {
	if limit <= 0 {
		return 0, nil // LIMIT -1 would mean none to SQLite
	}
	n, err := b.exec(ctx, b.q.sweep, now.UnixNano(), limit)
	if err != nil {
		// n counts the deletions of a transaction that did not commit
		// (a full disk fails the commit, after the DELETE ran).
		return 0, err
	}
	return int(n), nil
}

// Each calls fn for every record, in key order, stopping at fn's first
// error. It reads a page of records per query, by key from where the last
// ended, and calls fn once the page's rows are closed: fn may call b, and a
// long listing keeps no read open (one that did would keep the WAL from
// being checkpointed back to its start).
func (b *Backend) Each(ctx context.Context, fn func(backend.Record) error) error {
	return paging.Each(ctx, b.page, fn)
}

// page reads up to limit records with keys after after, in key order.
func (b *Backend) page(ctx context.Context, after string, limit int) ([]backend.Record, error) {
	rows, err := b.query(ctx, nil, b.q.each, after, limit)
	if err != nil {
		return nil, closedErr(err)
	}
	defer rows.Close()
	var page []backend.Record
	for rows.Next() {
		rec, err := scan(rows)
		if err != nil {
			return nil, err
		}
		page = append(page, rec)
	}
	return page, closedErr(rows.Err())
}

// scanOne reads the one record that rows, a query's result, may hold, and
// closes rows.
func scanOne(rows *sql.Rows, err error) (backend.Record, bool, error) {
	if err != nil {
		return backend.Record{}, false, closedErr(err)
	}
	defer rows.Close()
	if !rows.Next() {
		return backend.Record{}, false, closedErr(rows.Err())
	}
	rec, err := scan(rows)
	if err != nil {
		return backend.Record{}, false, err
	}
	return rec, true, closedErr(rows.Close())
}

// scan reads the record at rows' cursor.
func scan(rows *sql.Rows) (backend.Record, error) {
	var rec backend.Record
	var fp []byte
	var state, created int64
	var expires, lease sql.NullInt64
	var steps []byte
	if err := rows.Scan(&rec.Key, &fp, &rec.Token, &state, &created, &expires, &lease, &rec.Value, &rec.Failed, &rec.ErrMsg, &steps); err != nil {
		return backend.Record{}, fmt.Errorf("sqlite: reading a record: %w", err)
	}
	var err error
	if rec.Steps, err = backend.ReadSteps(steps); err != nil {
		return backend.Record{}, fmt.Errorf("sqlite: key %q: %w", rec.Key, err)
	}
	if len(fp) != len(rec.Fingerprint) {
		return backend.Record{}, fmt.Errorf("sqlite: key %q: fingerprint of %d bytes", rec.Key, len(fp))
	}
	if state < int64(backend.StatePending) || state > int64(backend.StateInterrupted) {
		return backend.Record{}, fmt.Errorf("sqlite: key %q: unknown state %d", rec.Key, state)
	}
	if state == int64(backend.StateCompleted) && !expires.Valid {
		// Complete always sets one: without it, the zero instant would
		// make the outcome long expired, and Get would report the key
		// absent while every claim of it fails.
		return backend.Record{}, fmt.Errorf("sqlite: key %q: a completed record without an expiry", rec.Key)
	}
	copy(rec.Fingerprint[:], fp)
	rec.State = backend.RecordState(state)
	rec.CreatedAt = time.Unix(0, created)
	if expires.Valid {
		rec.ExpiresAt = time.Unix(0, expires.Int64)
	}
	if lease.Valid {
		rec.LeaseUntil = time.Unix(0, lease.Int64)
	}
	return rec, nil
}
