// Package mysql is a backend.Backend in a MySQL or MariaDB table, shared by
// every process and machine that uses the same database, over database/sql
// with github.com/go-sql-driver/mysql.
//
// Keys and tokens are bytes: the key column is VARBINARY, so only
// identical bytes are one key, whatever the server's collation (the common
// utf8mb4_general_ci would make "Order-1" and "order-1" one key, and its
// PAD SPACE rules "a" and "a ").
//
// A claim is one INSERT ... ON DUPLICATE KEY UPDATE under the primary
// key, so InnoDB decides, atomically, which of many concurrent claims
// wins; the others change nothing. The insert that wins reports the
// instant it made the claim at (as its LAST_INSERT_ID), which is all the
// claim's record needs: a new key is one round trip, which returns no
// rows. One that meets a record reads it: two. On MariaDB (10.5 and later)
// the same statement can return, with RETURNING, the record that stands,
// won or not, in one round trip, but a result set costs a new key more
// than the insert alone: a Backend whose recent claims mostly met a record
// (replays) sends RETURNING, and the insert alone otherwise. MySQL 8 has
// no INSERT ... RETURNING. An expired record is taken over by one
// conditional UPDATE. Complete, Release and Renew
// compare the claim's token in their WHERE clause, so a stale owner can
// never write over a newer claim. So do RecordStep and Resume
// (backend.Stepper): a record's steps are one encoded column, rewritten
// under the row's lock.
//
// Time is the server's: every lease, expiry and creation instant is made
// and compared by the statements themselves, from UTC_TIMESTAMP(6), and
// durations the Store sends. Neither the clocks of the machines that call
// the database nor a session's time_zone decide who owns a key. A
// RunOnceTx's outcome expires a TTL after its claim's instant, made before
// fn ran, plus the time fn took: fn may SET its session's timestamp, which
// UTC_TIMESTAMP follows, and the outcome is still kept for the TTL.
//
// Isolation: statements the backend sends alone run in autocommit, at the
// session's level (REPEATABLE READ by default); the claim and every write
// are correct at any level. One chosen as a deadlock victim (1213), or
// cut short by one of the operator's limits (innodb_lock_wait_timeout,
// 1205; MariaDB's max_statement_time, 1969; MySQL's max_execution_time,
// 3024), was rolled back and is sent again until its ctx ends, so callers
// never see one: concurrent inserts of one key deadlock on their next-key
// locks under REPEATABLE READ, and a claim waits on a RunOnceTx's
// uncommitted claim for as long as its fn runs. A statement that may meet
// such a claim (a claim, a takeover, a Forget) waits for its row lock one
// second at most, not innodb_lock_wait_timeout, and is sent again while
// its ctx allows: one whose caller gave up must not wait on at the server,
// and land later. A Forget that meets such a lock, or is cut short by a
// limit, answers idem.ErrInProgress, whether the transaction is still in
// flight when the wait ends or committed during it: Forget deletes only
// the record it read before it waited. The sweep,
// and the transactions the backend opens itself
// (RecordStep, RunOnceTx), are READ COMMITTED: they lock the rows they
// touch, not the gaps between them, where claims insert.
//
// New creates the table under a named lock (GET_LOCK), on a connection of
// its own and never inside a transaction, since DDL commits the one open:
// any number of replicas may start at once.
//
// # Values
//
// Results, error messages and steps are LONGBLOBs, as large as the other
// backends take; one request, and one row read, must fit in a packet of
// the server's max_allowed_packet (16 MiB on MariaDB 10.11, 64 MiB on
// MySQL 8) and of the driver's maxAllowedPacket (64 MiB): a larger value
// fails with an error that names max_allowed_packet, and the key is left
// as it was.
//
// # Connections
//
// The statements of a new key and a replay (the claim and the outcome)
// are prepared on the server once per connection and then run by their
// handle: one round trip each, parsed once, whatever the DSN. A Backend
// holds up to four such statements on each connection it has used, and
// closes them once it is no longer referenced; a server at its
// max_prepared_stmt_count gets them as plain queries for a while instead.
// Add interpolateParams=true to the DSN for the other statements (a
// renewal, a release, Forget, the sweep, a listing, RunOnceTx's): the
// driver then sends each as one query, not a prepare, an execute and a
// close, which halves their round trips (the backend's statements take
// only numbers and bytes, which the driver escapes safely). The backend
// works without it, and with any time_zone, loc or parseTime: it reads
// instants as numbers. Any sql_mode will do, EMPTY_STRING_IS_NULL
// included: no statement sends an empty string that the mode would turn
// into a NULL the table refuses (a success's empty error message) or that
// matches nothing (the key a listing starts after).
//
// # MySQL 8 and MariaDB
//
// The statements are the same on both but for the claim's RETURNING,
// which New asks the server about (VERSION()); neither has UPDATE ...
// RETURNING, so Resume reads its record back by its new token. The tests
// run on MariaDB, the MySQL 8 shape of the claim included. Every claim's
// insert sets its session's LAST_INSERT_ID(), which code sharing the pool
// should read only after an insert of its own on the same connection, as
// MySQL prescribes anyway.
//
// RunOnceTx is the transactional mode: the key, the caller's own writes and
// the outcome commit in one transaction.
package mysql

import (
	"context"
	"database/sql"
	_ "embed"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
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
	// Table names the table, optionally database-qualified
	// ("billing.keys"). Empty means "idem_keys", in the DSN's database.
	Table string

	// NoMigrate leaves the schema alone: the table must already exist, as
	// Schema creates it. False means New creates the table if it is
	// absent.
	NoMigrate bool
}

// Backend is a backend.Backend over a MySQL or MariaDB table. It is safe
// for concurrent use by many goroutines and processes.
type Backend struct {
	db *sql.DB
	q  queries
	// returning: the server runs INSERT ... RETURNING (MariaDB 10.5 and
	// later), and a claim is one statement.
	returning bool
	// packet is the server's max_allowed_packet, in bytes, as New found
	// it: no row larger can be written or read back.
	packet int64
	// prep holds the statements of a new key and a replay, prepared
	// (prepared.go); nil sends them as plain queries.
	prep *prepared
	// mix is how often claims lately met a record, which decides how
	// the next claims are sent (claimOnce).
	mix claimMix
}

var (
	_ backend.Backend = (*Backend)(nil)
	_ backend.Lister  = (*Backend)(nil)
)

// New returns a Backend over db, creating its table unless opts.NoMigrate.
// The caller keeps ownership of db and closes it after the Stores that use
// the Backend.
func New(ctx context.Context, db *sql.DB, opts Options) (*Backend, error) {
	switch {
	case ctx == nil:
		return nil, errors.New("mysql: New with a nil context")
	case db == nil:
		return nil, errors.New("mysql: New with a nil *sql.DB")
	}
	name := opts.Table
	if name == "" {
		name = "idem_keys"
	}
	table, err := quoteTable(name)
	if err != nil {
		return nil, err
	}
	var version string
	var packet int64
	if err := db.QueryRowContext(ctx, `SELECT VERSION(), @@max_allowed_packet`).Scan(&version, &packet); err != nil {
		return nil, fmt.Errorf("mysql: asking the server's version: %w", err)
	}
	mariaDB := strings.Contains(version, "MariaDB")
	q := newQueries(table, mariaDB)
	prep := newPrepared(db, q)
	b := &Backend{db: db, q: q, returning: insertReturns(version), packet: packet, prep: prep}
	prep.releaseWith(b)
	if !opts.NoMigrate {
		if err := migrate(ctx, db, table, name); err != nil {
			return nil, fmt.Errorf("mysql: creating table %s: %w", table, err)
		}
	}
	if err := checkUniqueKey(ctx, db, name); err != nil {
		return nil, fmt.Errorf("mysql: table %s: %w", table, err)
	}
	return b, nil
}

var mariaDBVersion = regexp.MustCompile(`^(\d+)\.(\d+)\.\d+.*MariaDB`)

// insertReturns reports whether a server of version runs INSERT ...
// RETURNING: MariaDB from 10.5.
func insertReturns(version string) bool {
	m := mariaDBVersion.FindStringSubmatch(version)
	if m == nil {
		return false
	}
	major, _ := strconv.Atoi(m[1])
	minor, _ := strconv.Atoi(m[2])
	return major > 10 || major == 10 && minor >= 5
}

// nested refuses (errNested) a call made with the ctx of a RunOnceTx's
// fn on a pool of one connection (SetMaxOpenConns(1)): fn's transaction
// holds that connection until fn returns, and fn's ctx does not end when
// its caller's does, so the call would wait for it for ever. Every
// method that sends a statement on the pool asks it first.
func (b *Backend) nested(ctx context.Context) error {
	if ctx.Value(inTx{}) == b.db && b.db.Stats().MaxOpenConnections == 1 {
		return backend.Refuse(errNested)
	}
	return nil
}

// Claim claims rec.Key, judging leases and expiry by the server's clock;
// now is ignored. A standing record that holds rec.Token is a claim of
// this same request whose reply was lost: it is returned as won.
func (b *Backend) Claim(ctx context.Context, rec backend.Record, _ time.Time, lease time.Duration) (backend.Record, bool, error) {
	if err := ctx.Err(); err != nil {
		// Nothing sent: a refusal (backend.ErrRefused), which the Store
		// need not read back.
		return backend.Record{}, false, backend.Refuse(err)
	}
	if err := b.nested(ctx); err != nil {
		return backend.Record{}, false, err
	}
	key, fp, token, us := []byte(rec.Key), rec.Fingerprint[:], []byte(rec.Token), micros(lease)
	for {
		got, err := retried(ctx, func() (found, error) { return b.claimOnce(ctx, b.pooled(), &rec, key, fp, token, us) })
		switch {
		case answered(err):
			// The server refused the statement, which it ran alone: it
			// wrote nothing, and the Store need not read the key back.
			return backend.Record{}, false, backend.Refuse(err)
		case err != nil:
			return backend.Record{}, false, err
		case got.ok && !got.expired:
			return got.rec, got.rec.ClaimedBy(rec.Token), nil
		case got.ok: // expired: take it over, unless another claim did first
			if _, err := b.exec(ctx, b.q.takeOver, rec.Fingerprint[:], token, us, key); err != nil {
				return backend.Record{}, false, err
			}
		}
		// Taken over (by this claim or another), or deleted between the
		// insert and the read (a sweep, a Forget): read what stands.
		if err := ctx.Err(); err != nil {
			return backend.Record{}, false, err
		}
	}
}

// pooled is the querier of the backend's own statements on its pool.
func (b *Backend) pooled() querier {
	if b.prep == nil {
		return b.db
	}
	return pool{b.prep}
}

// A found is a record read, if ok, with whether it expired.
type found struct {
	rec     backend.Record
	ok      bool
	expired bool
}

// querier is what a claim needs of a *sql.DB or a *sql.Tx.
type querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// claimOnce inserts the claim unless the key has a record, and returns the
// record that stands, in one of two ways, whichever costs this Backend's
// recent claims less (claimMix):
//
//   - The insert alone (an Exec), which reports, as its LAST_INSERT_ID,
//     the instant it made the claim at, or 0 if the key had a record: a new
//     key is one round trip that returns no rows, its lease that instant
//     plus lease; a key that has a record is read back, a round trip more.
//     MySQL 8, which has no INSERT ... RETURNING, always claims so.
//   - On MariaDB, INSERT ... RETURNING: one round trip whether the key is
//     new or not, but its answer is a result set, which database/sql
//     watches, for a cancellable ctx (every Store's), from a goroutine of
//     its own, and whose row is read and copied: for a new key, that costs
//     more than the Exec.
func (b *Backend) claimOnce(ctx context.Context, q querier, rec *backend.Record, key, fp, token []byte, lease int64) (found, error) {
	if b.returning && b.mix.returning() {
		f, err := queryOne(ctx, q, b.q.claim, []any{key, fp, token, lease})
		if err == nil {
			b.mix.note(!f.ok || f.rec.Token != rec.Token)
		}
		return f, err
	}
	res, err := q.ExecContext(ctx, b.q.insert, key, fp, token, lease)
	if err != nil {
		return found{}, err
	}
	if at, err := res.LastInsertId(); err == nil && at != 0 {
		b.mix.note(false)
		won := backend.Record{Key: rec.Key, Token: rec.Token, Fingerprint: rec.Fingerprint, State: backend.StatePending, CreatedAt: time.UnixMicro(at)}
		if lease != 0 {
			won.LeaseUntil = time.UnixMicro(at + lease)
		}
		return found{rec: won, ok: true}, nil
	}
	b.mix.note(true)
	f, err := queryOne(ctx, q, b.q.get, []any{key})
	if err == nil && f.ok && f.rec.Token == rec.Token && f.rec.State == backend.StateInterrupted {
		// The claim this call inserted (or took over) in an earlier
		// attempt whose reply was lost, read a round trip later, when a
		// lease shorter than that has lapsed: the answer is the record as
		// the insert left it, pending. (Its fate from here is the Store's,
		// as for a reply that arrives late.)
		f.rec.State = backend.StatePending
	}
	return f, err
}

// Complete records the outcome, expiring ttl after the server's now.
func (b *Backend) Complete(ctx context.Context, rec backend.Record, _ time.Time, ttl time.Duration) error {
	if err := b.nested(ctx); err != nil {
		return err
	}
	if err := b.fits(rec.Key, len(rec.Value)+len(rec.ErrMsg)); err != nil {
		return err
	}
	n, err := b.exec(ctx, b.q.complete, micros(ttl), rec.Value, rec.Failed, []byte(rec.ErrMsg), []byte(rec.Key), []byte(rec.Token))
	return backend.Owned(n, b.oversized(err, len(rec.Value)+len(rec.ErrMsg)), rec.Key)
}

// rowSlack is what a row holds beyond its values, with room to spare:
// key, token, fingerprint, instants, and the packet's framing.
const rowSlack = 2048

// fits refuses, before anything is sent, a write whose values (n bytes)
// would make a row larger than max_allowed_packet: the server would drop
// the connection on the request, or could not send the row back.
func (b *Backend) fits(key string, n int) error {
	if int64(n)+rowSlack <= b.packet {
		return nil
	}
	return backend.Refuse(fmt.Errorf("mysql: key %q: a row of %d bytes of values is larger than the server's max_allowed_packet (%d bytes), so it could not be written or read back: raise max_allowed_packet on the server (and the driver's maxAllowedPacket in the DSN), or store less", key, n, b.packet))
}

// oversized explains err, the failure of a write of n bytes of values,
// when that request may have exceeded max_allowed_packet after all: with
// interpolateParams the driver escapes bytes, up to twice as many, and a
// server sent a packet too large drops the connection, often before its
// error (1153) reaches the client.
func (b *Backend) oversized(err error, n int) error {
	if err == nil || int64(2*n)+rowSlack <= b.packet || answered(err) {
		return err
	}
	return fmt.Errorf("%w (the request, of up to %d bytes once escaped, may have exceeded the server's max_allowed_packet of %d bytes)", err, 2*n, b.packet)
}

func (b *Backend) Release(ctx context.Context, key, token string) error {
	if err := b.nested(ctx); err != nil {
		return err
	}
	n, err := b.exec(ctx, b.q.release, []byte(key), []byte(token))
	return backend.Owned(n, err, key)
}

// Renew extends the lease to lease after the server's now.
func (b *Backend) Renew(ctx context.Context, key, token string, _ time.Time, lease time.Duration) error {
	if err := b.nested(ctx); err != nil {
		return err
	}
	n, err := b.exec(ctx, b.q.renew, micros(lease), []byte(key), []byte(token))
	if err == nil && n == 0 {
		// MySQL counts the rows an UPDATE changed, not those it matched:
		// a lease set to the instant it held (two renewals within one
		// microsecond) changes none. Asked again: is the claim still
		// this token's, its lease holding?
		f, gerr := retried(ctx, func() (found, error) { return queryOne(ctx, b.pooled(), b.q.get, []any{[]byte(key)}) })
		if gerr != nil {
			return gerr
		}
		if f.ok && f.rec.ClaimedBy(token) {
			return nil
		}
	}
	return backend.Owned(n, err, key)
}

// Get returns key's record as the server's clock sees it.
func (b *Backend) Get(ctx context.Context, key string, _ time.Time) (backend.Record, bool, error) {
	if err := b.nested(ctx); err != nil {
		return backend.Record{}, false, err
	}
	f, err := retried(ctx, func() (found, error) { return queryOne(ctx, b.pooled(), b.q.get, []any{[]byte(key)}) })
	if err != nil || !f.ok || f.expired {
		return backend.Record{}, false, err
	}
	return f.rec, true, nil
}

// Forget judges the lease by the server's clock. It deletes the record
// as it read it before any lock wait, and only that: a RunOnceTx in flight
// holds its claim as a row lock, which Forget waits for briefly; if the
// transaction commits meanwhile, its record has another token, and Forget
// answers idem.ErrInProgress rather than delete the outcome just recorded.
func (b *Backend) Forget(ctx context.Context, key string, _ time.Time) error {
	if err := b.nested(ctx); err != nil {
		return err
	}
	k := []byte(key)
	// The record as last committed, by a plain read, which waits for no
	// lock: what the operator asked to forget.
	var (
		token []byte
		state int64
	)
	seen, err := retried(ctx, func() (bool, error) {
		err := b.db.QueryRowContext(ctx, b.q.look, k).Scan(&token, &state)
		if errors.Is(err, sql.ErrNoRows) {
			return false, nil
		}
		return err == nil, err
	})
	if err != nil {
		return err
	}
	if seen {
		n, err := retried(ctx, func() (int64, error) {
			res, err := b.db.ExecContext(ctx, b.q.forget, k, token, state)
			if err != nil {
				return 0, inFlight(key, err)
			}
			return res.RowsAffected()
		})
		if err != nil || n > 0 {
			return err
		}
	}
	// Nothing deleted: the key has no record, or its claim holds, or its
	// record changed since it was read (a transaction committed it while
	// the delete waited). The read locks, so it waits for a RunOnceTx's
	// uncommitted claim too.
	exists, err := retried(ctx, func() (bool, error) {
		err := b.db.QueryRowContext(ctx, b.q.exists, k).Scan(new(int))
		if errors.Is(err, sql.ErrNoRows) {
			return false, nil
		}
		return err == nil, inFlight(key, err)
	})
	if err != nil {
		return err
	}
	if exists {
		return fmt.Errorf("%w: key %q is claimed and its lease holds, or a transaction recorded it while Forget waited", idem.ErrInProgress, key)
	}
	return nil
}

// inFlight explains err, a Forget's statement's: one that the server cut
// short at one of its limits (a lock wait, a statement's time) met a row
// locked by a transaction in flight, a RunOnceTx's uncommitted claim,
// which may yet commit its outcome: the key is in progress, not a
// conflict to retry (%v: not retried()'s).
func inFlight(key string, err error) error {
	if cutShort(err) {
		return fmt.Errorf("%w: key %q is held by a transaction in flight (%v)", idem.ErrInProgress, key, err)
	}
	return err
}

// Sweep judges expiry by the server's clock. It deletes in a READ
// COMMITTED transaction, which locks the rows it deletes and not the gaps
// beside them, where claims insert.
func (b *Backend) Sweep(ctx context.Context, _ time.Time, limit int) (int, error) {
	if err := b.nested(ctx); err != nil {
		return 0, err
	}
	if limit <= 0 {
		return 0, nil
	}
	n, err := retried(ctx, func() (int64, error) {
		tx, err := b.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
		if err != nil {
			return 0, err
		}
		defer tx.Rollback() // a no-op once committed
		res, err := tx.ExecContext(ctx, b.q.sweep, limit)
		if err != nil {
			return 0, err
		}
		n, err := res.RowsAffected()
		if err != nil {
			return 0, err
		}
		if err := tx.Commit(); err != nil {
			return 0, err // not committed, or not known to be: nothing counts as swept
		}
		return n, nil
	})
	return int(n), err
}

// exec runs a statement, retried on a conflict, and returns the rows it
// changed.
func (b *Backend) exec(ctx context.Context, query string, args ...any) (int64, error) {
	return retried(ctx, func() (int64, error) {
		res, err := b.pooled().ExecContext(ctx, query, args...)
		if err != nil {
			return 0, err
		}
		return res.RowsAffected()
	})
}

// queryOne runs a query for at most one record, and reads it, and any
// columns after it into extra.
func queryOne(ctx context.Context, q querier, query string, args []any, extra ...any) (found, error) {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return found{}, err
	}
	defer rows.Close()
	if !rows.Next() {
		return found{}, rows.Err()
	}
	f, err := scanRecord(rows, extra...)
	if err != nil {
		return found{}, err
	}
	return f, rows.Close()
}

// scanRecord reads a record of seenColumns, and any columns after them
// into extra.
func scanRecord(rows *sql.Rows, extra ...any) (found, error) {
	// One allocation for every destination (each would escape on its
	// own); the bytes read in place (RawBytes) are copied once, into the
	// record's strings, before the next row.
	var c struct {
		f                             found
		key, fp, token, errMsg, steps sql.RawBytes
		state                         int64
		created, expires, lease       sql.NullInt64
		dest                          [12]any
	}
	f := &c.f
	c.dest = [12]any{&c.key, &c.fp, &c.token, &c.state, &c.created, &c.expires, &c.lease, &f.rec.Value, &f.rec.Failed, &c.errMsg, &c.steps, &f.expired}
	if err := rows.Scan(append(c.dest[:], extra...)...); err != nil {
		return found{}, err
	}
	key, fp, token, errMsg, steps, state, created, expires, lease := c.key, c.fp, c.token, c.errMsg, c.steps, c.state, c.created, c.expires, c.lease
	f.ok = true
	f.rec.Key, f.rec.Token, f.rec.ErrMsg = string(key), string(token), string(errMsg)
	if len(fp) != len(f.rec.Fingerprint) {
		return found{}, fmt.Errorf("mysql: key %q: fingerprint of %d bytes", f.rec.Key, len(fp))
	}
	copy(f.rec.Fingerprint[:], fp)
	var err error
	if f.rec.Steps, err = backend.ReadSteps(steps); err != nil {
		return found{}, fmt.Errorf("mysql: key %q: %w", f.rec.Key, err)
	}
	if state < int64(backend.StatePending) || state > int64(backend.StateInterrupted) {
		// A later version's state, or a damaged row: not a record to act
		// on (a Resolve would take it for interrupted and write over it).
		return found{}, fmt.Errorf("mysql: key %q: unknown state %d", f.rec.Key, state)
	}
	f.rec.State = backend.RecordState(state)
	f.rec.CreatedAt, f.rec.ExpiresAt, f.rec.LeaseUntil = instant(created), instant(expires), instant(lease)
	return *f, nil
}

// instant is a column of microseconds since the Unix epoch, or the zero
// time for NULL.
func instant(us sql.NullInt64) time.Time {
	if !us.Valid {
		return time.Time{}
	}
	return time.UnixMicro(us.Int64)
}

// Each calls fn for every record, in key order (of their bytes), stopping
// at fn's first error. It reads a page of records per query, by key from
// where the last ended, and calls fn once the page's rows are closed: fn
// may use the pool, however small, and a listing of millions holds no
// snapshot open.
func (b *Backend) Each(ctx context.Context, fn func(backend.Record) error) error {
	if err := b.nested(ctx); err != nil {
		return err
	}
	return paging.Each(ctx, b.page, fn)
}

// page reads up to limit records with keys after after, in key order.
func (b *Backend) page(ctx context.Context, after string, limit int) ([]backend.Record, error) {
	return retried(ctx, func() ([]backend.Record, error) {
		rows, err := b.db.QueryContext(ctx, b.q.page, []byte(after), limit)
		if err != nil {
			return nil, err
		}
		defer rows.Close()
		var page []backend.Record
		for rows.Next() {
			f, err := scanRecord(rows)
			if err != nil {
				return nil, err
			}
			page = append(page, f.rec)
		}
		return page, rows.Err()
	})
}
