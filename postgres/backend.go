// Package postgres is an backend.Backend in a PostgreSQL table, shared by every
// process and machine that uses the same database.
//
// A claim is one INSERT ... ON CONFLICT DO NOTHING statement that returns
// the standing record if it loses, so the table's primary key decides,
// atomically, which of many concurrent claims wins, and a replay writes
// nothing. An expired record is taken over by one conditional UPDATE.
// Complete, Release and Renew compare the claim's token in their WHERE
// clause, so a stale owner can never write over a newer claim. So do
// RecordStep and Resume (backend.Stepper): a record's steps are one encoded
// column, rewritten under the row's lock.
//
// Time is the server's: every lease, expiry and creation instant is made
// and compared by the statements themselves (clock_timestamp()), from
// durations the Store sends. The clocks of the machines that call the
// database never decide who owns a key, so skew between them cannot cause
// a second execution.
//
// Isolation: each statement the backend sends alone runs in the session's
// default isolation, which a team may have made SERIALIZABLE; the claim and
// every write are correct under any level, and one that fails as a
// serialization failure or deadlock (40001, 40P01) took no effect and is
// sent again, so callers never see one. Transactions the backend opens
// itself (RecordStep, RunOnceTx) are READ COMMITTED.
//
// Wait limits: a statement_timeout or lock_timeout that an operator sets
// for the role, the database or the server ends a claim that waits on a
// row a transaction still holds (a RunOnceTx running its fn). The backend
// sends that claim again until the transaction ends or the caller's ctx
// does, so a duplicate waits as it would on a server without a limit; a
// Forget so cut short is refused as in progress. Other statements that
// outlast the limit fail with the server's error.
//
// New creates the table under an advisory lock, so any number of replicas
// may start at once.
//
// # Layout
//
// No index holds a column that Complete writes, so PostgreSQL can make
// each Complete a HOT update: the new row version goes on the same page
// (the table's fillfactor is 90, to leave room), no index entry is added,
// and the old version is pruned without a vacuum. The sweep's index is on
// sweep_at, which the claim sets: its instant plus the shortest TTL this
// Backend's Completes have sent, no later than its outcome can expire. A
// Complete of a shorter TTL lowers it (that Complete is not HOT); a row
// the sweep finds by sweep_at before it is due (a longer TTL, a claim
// never completed) is moved along the index, to its expiry or a TTL on, so
// that sweeps do not read it again and again. The table autovacuums at 1%
// of its rows dead, not 20%.
//
// # Partitioned tables
//
// Past a few hundred million keys, a team may rather drop a day of records
// whole than delete them row by row. The primary key of a partitioned
// table must hold the partition key, so the table can be partitioned by
// range of key, for keys that begin with their time (a date prefix, or a
// UUIDv7, whose text sorts by its instant), with a default partition for
// every other key:
//
//	CREATE TABLE idem_keys (... as in schema.sql ...) PARTITION BY RANGE (key);
//	CREATE INDEX ON idem_keys (sweep_at);
//	CREATE TABLE idem_keys_20261201 PARTITION OF idem_keys
//	    FOR VALUES FROM ('2026-12-01') TO ('2026-12-02') WITH (fillfactor = 90);
//	CREATE TABLE idem_keys_default PARTITION OF idem_keys DEFAULT WITH (fillfactor = 90);
//
// and opened with NoMigrate (New's migration is for a plain table). Every
// method works on it as on the plain table. Make the partitions a few
// days ahead: attaching one scans the default partition for rows of its
// range, and fails (23514) if a key of that day has come early. Storage
// parameters go on each partition (a partitioned table takes none): the
// fillfactor as above, and the autovacuum settings of schema.sql. Creating
// and dropping a partition take locks that queue behind a long query and
// make every call wait behind them: run them with a lock_timeout, and
// again if it passes. Dropping one (ALTER TABLE ... DETACH PARTITION, a
// brief ACCESS EXCLUSIVE lock, since CONCURRENTLY is refused while a
// default partition exists; then DROP TABLE) forgets its keys at once,
// pending ones too, as an operator's Forget would: drop a day only once it
// is older than the TTL plus the longest an operation runs. A key of a
// dropped day that comes again lands in the default partition and runs
// afresh, as after its TTL. idemhttp's keys begin with their scope,
// not their time: partition those by scope (LIST), or not at all.
//
// RunOnceTx is the transactional mode: the key, the caller's own writes and
// the outcome commit in one transaction.
package postgres

import (
	"context"
	_ "embed"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
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
	// Table names the table, optionally schema-qualified ("billing.keys").
	// Empty means "idem_keys".
	Table string

	// NoMigrate leaves the schema alone: the table must already exist, as
	// Schema creates it (one made before steps needs their column: see
	// schema.sql). False means New creates the table and its index if they
	// are absent, and adds the steps column to a table made before it.
	NoMigrate bool
}

// Backend is an backend.Backend over a PostgreSQL table. It is safe for
// concurrent use by many goroutines and processes.
type Backend struct {
	pool *pgxpool.Pool
	q    queries

	// deadlines: the pool's connections end a statement whose ctx ends
	// by a deadline on their socket, which onConn then sets itself.
	deadlines bool

	// ttl is the shortest TTL, in microseconds, that a Complete has sent:
	// a claim's sweep_at is its instant plus ttl, no later than its
	// outcome can expire. Zero before the first.
	ttl atomic.Int64
}

var _ backend.Backend = (*Backend)(nil)

// New returns a Backend over pool, creating its table unless opts.NoMigrate.
// The caller keeps ownership of pool and closes it after the Stores that use
// the Backend.
func New(ctx context.Context, pool *pgxpool.Pool, opts Options) (*Backend, error) {
	name := opts.Table
	if name == "" {
		name = "idem_keys"
	}
	parts := strings.Split(name, ".")
	for _, part := range parts {
		if len(part) > maxIdentifier {
			// PostgreSQL would truncate it, silently: two names that
			// differ past the 63rd byte would share one table.
			return nil, fmt.Errorf("postgres: table name %q: %q is longer than PostgreSQL's %d bytes", name, part, maxIdentifier)
		}
	}
	table := pgx.Identifier(parts).Sanitize()
	b := &Backend{pool: pool, q: newQueries(table), deadlines: deadlineHandled(pool.Config().ConnConfig)}
	if !opts.NoMigrate {
		if err := migrate(ctx, pool, table, name); err != nil {
			return nil, fmt.Errorf("postgres: creating table %s: %w", table, err)
		}
	}
	return b, nil
}

// queries are the statements, written once for the table's name.
type queries struct {
	claim, takeOver, complete, completeTx, release, renew, get, forget, exists, sweep, reaim, page string
	lockSteps, setSteps, resume                                                                    string
}

const columns = `key, fingerprint, token, state, created_at, expires_at, lease_until, value, failed, err_msg, steps`

// named and seenNamed are columns and seenColumns as a statement returns
// them: named with one letter each, which pgx reads into a string of one
// byte, which Go does not allocate (a name of more is copied for every
// row description: 7 allocations a claim). The record is read by position.
const (
	named     = `key AS c, fingerprint AS d, token AS e, state AS f, created_at AS g, expires_at AS h, lease_until AS i, value AS j, failed AS k, err_msg AS l, steps AS m`
	seenNamed = `key AS c, fingerprint AS d, token AS e, ` + seen + ` AS f, created_at AS g, expires_at AS h, lease_until AS i, value AS j, failed AS k, err_msg AS l, steps AS m`
)

// Every instant is the server's: the statements compute them from
// clock_timestamp() (the moment the statement runs, even inside a long
// transaction) and take durations, in microseconds, as parameters. So the
// clocks of the machines that call the database never decide a lease or an
// expiry.
const (
	serverNow = `clock_timestamp()`
	// seen is the state column as the server's clock judges it: a pending
	// record whose lease lapsed is interrupted.
	seen = `CASE WHEN state = 1 AND lease_until <= ` + serverNow + ` THEN 3 ELSE state END`
	// live excludes completed records that have expired. A completed
	// record without an expiry (none Complete writes: a damaged row) is
	// kept, for scanInto to report, not compared to NULL and left out,
	// which would make Get answer "no record".
	live = `(state = 2 AND expires_at <= ` + serverNow + `) IS NOT TRUE`
	// seenColumns are columns with the state as seen.
	seenColumns = `key, fingerprint, token, ` + seen + `, created_at, expires_at, lease_until, value, failed, err_msg, steps`
)

// after is the SQL for the instant that many microseconds (parameter p)
// after the server's now, or NULL for zero: no lease. A negative p is the
// server's now itself: a lease that has lapsed already.
func after(p string) string { return afterAt(p, serverNow) }

// afterAt is after, counted from the instant now (SQL).
func afterAt(p, now string) string {
	return `CASE WHEN ` + p + `::bigint > 0 THEN ` + now + ` + ` + p + `::bigint * interval '1 microsecond' WHEN ` + p + `::bigint < 0 THEN ` + now + ` END`
}

// claimNow is the one instant a claim's columns are counted from: read
// once (a CTE with a volatile function is evaluated once), so that a
// lapsed claim's lease ends at its created_at exactly, the mark of a
// transactional claim committed without its outcome; two reads of
// clock_timestamp() in one row can be microseconds apart.
const claimNow = `(SELECT ts FROM claim_clock)`

func newQueries(t string) queries {
	return queries{
		// One round trip: insert the claim, or return the record that
		// stands, with whether it expired. DO NOTHING takes no lock on a
		// conflicting row, so a replay writes nothing and costs no WAL
		// flush. If a concurrent claim committed after this statement's
		// snapshot, neither branch yields a row, and Claim runs it again.
		claim: `WITH claim_clock AS (SELECT ` + serverNow + ` AS ts), claimed AS (
    INSERT INTO ` + t + ` (key, fingerprint, token, state, created_at, lease_until, sweep_at)
    VALUES ($1, $2, $3, 1, ` + claimNow + `, ` + afterAt("$4", claimNow) + `, ` + claimNow + ` + $5::bigint * interval '1 microsecond')
    ON CONFLICT (key) DO NOTHING
    RETURNING ` + columns + `)
SELECT true AS a, false AS b, ` + named + ` FROM claimed
UNION ALL
SELECT false, NOT (` + live + `), ` + seenColumns + ` FROM ` + t + ` WHERE key = $1 AND NOT EXISTS (SELECT 1 FROM claimed)`,
		// Takes over a record that expired, atomically: the WHERE clause is
		// checked against the row as it stands when the UPDATE locks it.
		takeOver: `WITH claim_clock AS (SELECT ` + serverNow + ` AS ts)
UPDATE ` + t + ` SET fingerprint = $2, token = $3, state = 1, created_at = ` + claimNow + `, expires_at = NULL,
    lease_until = ` + afterAt("$4", claimNow) + `, value = NULL, failed = false, err_msg = '', steps = NULL,
    sweep_at = ` + claimNow + ` + $5::bigint * interval '1 microsecond'
WHERE key = $1 AND NOT (` + live + `)
RETURNING true AS a, false AS b, ` + named,
		complete: `UPDATE ` + t + ` SET state = 2, ` + expiry + `, lease_until = NULL,
    value = $4, failed = $5, err_msg = $6
WHERE key = $1 AND token = $2 AND state <> 2`,
		// Inside RunOnceTx: the transaction's id comes back, to ask about
		// its COMMIT if the reply to that is lost.
		completeTx: `UPDATE ` + t + ` SET state = 2, ` + expiry + `, lease_until = NULL,
    value = $4, failed = $5, err_msg = $6
WHERE key = $1 AND token = $2 AND state <> 2
RETURNING txid_current()`,
		release: `DELETE FROM ` + t + ` WHERE key = $1 AND token = $2 AND state <> 2`,
		renew: `UPDATE ` + t + ` SET lease_until = ` + serverNow + ` + $3::bigint * interval '1 microsecond'
WHERE key = $1 AND token = $2 AND state = 1`,
		get:  `SELECT ` + seenNamed + ` FROM ` + t + ` WHERE key = $1 AND ` + live,
		page: `SELECT ` + seenColumns + ` FROM ` + t + ` WHERE key > $1 ORDER BY key LIMIT $2`,
		forget: `DELETE FROM ` + t + ` WHERE key = $1
    AND NOT (state = 1 AND (lease_until IS NULL OR lease_until > ` + serverNow + `))`,
		exists: `SELECT EXISTS (SELECT 1 FROM ` + t + ` WHERE key = $1)`,
		// The index finds the rows whose sweep_at has passed, oldest
		// first; of those, the ones that have expired go. now() rather
		// than clock_timestamp(): it is stable within the statement, so
		// the index can serve the scan.
		sweep: `DELETE FROM ` + t + ` WHERE key IN (
    SELECT key FROM ` + t + ` WHERE sweep_at <= now() AND state = 2 AND expires_at <= now()
    ORDER BY sweep_at LIMIT $1 FOR UPDATE SKIP LOCKED)`,
		// The rows a sweep finds due by sweep_at but not expired (a
		// longer TTL than the claim assumed, a claim never completed: an
		// interrupted key, which never expires) would be read again by
		// every sweep; so would rows without sweep_at (claimed by a
		// version before it). Each is given the next instant it could be
		// due: its expiry, or for a pending one none ('infinity': its
		// Complete, if it comes, brings sweep_at down to its expiry).
		reaim: `WITH early AS (
    SELECT key FROM ` + t + ` WHERE sweep_at <= now() AND NOT (state = 2 AND expires_at <= now())
    ORDER BY sweep_at LIMIT $1 FOR UPDATE SKIP LOCKED
), unset AS (
    SELECT key FROM ` + t + ` WHERE sweep_at IS NULL LIMIT $1 FOR UPDATE SKIP LOCKED
)
UPDATE ` + t + ` r SET sweep_at = CASE WHEN state = 2 THEN expires_at ELSE 'infinity' END
FROM (SELECT key FROM early UNION SELECT key FROM unset) due WHERE r.key = due.key`,
		// RecordStep's read: the steps of the claim token holds, locked
		// until its transaction ends, and the server's now for the step.
		// Under the lock no Resume, Complete or Forget can slip in between
		// this check and setSteps.
		lockSteps: `SELECT steps, ` + serverNow + ` FROM ` + t + `
WHERE key = $1 AND token = $2 AND state = 1 AND (lease_until IS NULL OR lease_until > ` + serverNow + `)
FOR UPDATE`,
		setSteps: `UPDATE ` + t + ` SET steps = $3 WHERE key = $1 AND token = $2`,
		// Takes over a record seen as interrupted, atomically, as takeOver
		// does: concurrent Resumes queue on the row, and those after the
		// first find another token.
		resume: `UPDATE ` + t + ` SET token = $3, state = 1, lease_until = ` + after("$4") + `
WHERE key = $1 AND token = $2 AND ` + seen + ` = 3
RETURNING ` + named,
	}
}

// expiry is Complete's SET clause for the expiry, $3 microseconds after
// the server's now, and for sweep_at, which only ever comes down to the
// expiry: for the TTL the claim assumed it stays as it is, and an update
// that leaves every indexed column's value as it was can be HOT.
const expiry = `(expires_at, sweep_at) = (SELECT e, least(sweep_at, e) FROM (SELECT ` + serverNow + ` + $3::bigint * interval '1 microsecond') c (e))`

// micros is d in microseconds, the unit the statements take, rounded up:
// a positive lease or TTL never becomes zero, which means none.
func micros(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	n := int64(d / time.Microsecond)
	if d%time.Microsecond != 0 {
		n++
	}
	return n
}

// nested refuses (errNested) a call made with the ctx of a RunOnceTx's
// fn on a pool of one connection (MaxConns 1): fn's transaction holds
// that connection until fn returns, and fn's ctx does not end with its
// caller's, so the call would wait for it for ever. Every method that
// sends a statement on the pool asks it first.
func (b *Backend) nested(ctx context.Context) error {
	if ctx.Value(inTx{}) == b.pool && b.pool.Config().MaxConns <= 1 {
		return backend.Refuse(errNested)
	}
	return nil
}

// Claim claims rec.Key, judging leases and expiry by the server's clock;
// now is ignored. The claim's sweep_at, which the sweep's index holds, is
// its instant plus the TTL of the last Complete (see learn): Complete then
// writes no indexed column, and can be a HOT update.
func (b *Backend) Claim(ctx context.Context, rec backend.Record, _ time.Time, lease time.Duration) (backend.Record, bool, error) {
	if err := ctx.Err(); err != nil {
		// Nothing sent: a refusal (backend.ErrRefused), which the Store
		// need not read back.
		return backend.Record{}, false, backend.Refuse(err)
	}
	if err := b.nested(ctx); err != nil {
		return backend.Record{}, false, err
	}
	c := &claimCall{key: textArg(rec.Key), token: textArg(rec.Token), print: rec.Fingerprint, lease: int64Arg(micros(lease)), ttl: int64Arg(b.ttl.Load())}
	c.fp = c.print[:]
	c.args = [...]any{&c.key, &c.fp, &c.token, &c.lease, &c.ttl}
	c.extra = [...]any{&c.won, &c.expired}
	// A claim that waits on the row of a transaction still open (a
	// RunOnceTx) waits until it ends or ctx does, whatever the server's
	// statement_timeout or lock_timeout (awaited).
	won, err := awaited(ctx, func() (bool, error) { return b.claim(ctx, c) })
	if answered(err) {
		// The server refused the statement, which it ran alone: it wrote
		// nothing, and the Store need not read the key back.
		return backend.Record{}, false, backend.Refuse(err)
	}
	if err != nil {
		return backend.Record{}, false, err
	}
	return c.got, won, nil
}

// A claimCall is what one Claim sends and reads, in one allocation: its
// arguments, which args points to (pgx sends what a pointer points to;
// a pointer in an interface allocates nothing, where a string, a slice or
// an int64 above 255 does), and the row it reads back, whose key and
// token, on a win, are the ones sent and are not copied again.
type claimCall struct {
	key, token   textArg
	fp           bytesArg
	print        [32]byte
	lease, ttl   int64Arg
	args         [5]any
	won, expired bool
	extra        [2]any
	r            row
	got          backend.Record
}

// textArg, bytesArg and int64Arg are arguments pgx sends by pointer, with
// no allocation: pgx encodes a *string or an *int64 by boxing what it
// points to (reflect), but calls the Valuer methods of these types as
// they are.
type (
	textArg  string
	bytesArg []byte
	int64Arg int64
)

func (a *textArg) TextValue() (pgtype.Text, error) {
	return pgtype.Text{String: string(*a), Valid: true}, nil
}

// BytesValue is nil, which pgx sends as NULL, for a nil slice.
func (a *bytesArg) BytesValue() ([]byte, error) { return *a, nil }

func (a *int64Arg) Int64Value() (pgtype.Int8, error) {
	return pgtype.Int8{Int64: int64(*a), Valid: true}, nil
}

// A found is a record and whether it was found (Get) or won (Claim).
type found struct {
	rec backend.Record
	ok  bool
}

// claim claims the key c names, or reads the record that stands, into
// c.got, and reports whether it won.
func (b *Backend) claim(ctx context.Context, c *claimCall) (bool, error) {
	for {
		found, err := b.queryClaim(ctx, b.q.claim, c)
		switch {
		case err != nil:
			return false, err
		case found && !c.expired:
			return c.won, nil
		case found: // expired: take it over, unless another claim did first
			if found, err = b.queryClaim(ctx, b.q.takeOver, c); err != nil || found {
				return c.won, err
			}
		}
		if err := ctx.Err(); err != nil {
			return false, err
		}
	}
}

// queryClaim runs a claim's statement, which returns at most one record
// after won and expired, into c, retried on a conflict.
func (b *Backend) queryClaim(ctx context.Context, sql string, c *claimCall) (bool, error) {
	return retried(ctx, func() (bool, error) {
		var ok bool
		err := b.onConn(ctx, func(ctx context.Context, q querier) error {
			rows, err := q.Query(ctx, sql, c.args[:]...)
			if err != nil {
				return err
			}
			defer rows.Close()
			c.r = row{key: string(c.key), token: string(c.token)}
			c.got, ok, err = scanInto(rows, &c.r, c.extra[:])
			return err
		})
		return ok, err
	})
}

// learn keeps the shortest TTL sent for the claims that follow: their
// sweep_at is their instant plus that TTL, an instant their outcome cannot
// expire before. With one TTL (a Store always sends its own) Complete
// leaves sweep_at as it is; a shorter one lowers it (and that Complete is
// not HOT); a longer one leaves the row for a sweep to find early and
// re-aim at its expiry (reaim).
func (b *Backend) learn(ttl time.Duration) {
	us := micros(ttl)
	for {
		cur := b.ttl.Load()
		if us <= 0 || (cur != 0 && cur <= us) || b.ttl.CompareAndSwap(cur, us) {
			return
		}
	}
}

// Complete records the outcome, expiring ttl after the server's now.
func (b *Backend) Complete(ctx context.Context, rec backend.Record, _ time.Time, ttl time.Duration) error {
	if err := b.nested(ctx); err != nil {
		return err
	}
	b.learn(ttl)
	// One allocation for the arguments, which args points to (see
	// claimCall).
	c := &struct {
		key, token, errMsg textArg
		ttl                int64Arg
		value              bytesArg
		args               [6]any
	}{key: textArg(rec.Key), token: textArg(rec.Token), errMsg: textArg(backend.StorableText(rec.ErrMsg)), ttl: int64Arg(micros(ttl)), value: bytesArg(rec.Value)}
	c.args = [...]any{&c.key, &c.token, &c.ttl, &c.value, rec.Failed, &c.errMsg}
	tag, err := b.exec(ctx, b.q.complete, c.args[:]...)
	return backend.Owned(tag.RowsAffected(), err, rec.Key)
}

func (b *Backend) Release(ctx context.Context, key, token string) error {
	if err := b.nested(ctx); err != nil {
		return err
	}
	tag, err := b.exec(ctx, b.q.release, key, token)
	return backend.Owned(tag.RowsAffected(), err, key)
}

// Renew extends the lease to lease after the server's now.
func (b *Backend) Renew(ctx context.Context, key, token string, _ time.Time, lease time.Duration) error {
	if err := b.nested(ctx); err != nil {
		return err
	}
	tag, err := b.exec(ctx, b.q.renew, key, token, micros(lease))
	return backend.Owned(tag.RowsAffected(), err, key)
}

// Get returns key's record as the server's clock sees it.
func (b *Backend) Get(ctx context.Context, key string, _ time.Time) (backend.Record, bool, error) {
	if err := b.nested(ctx); err != nil {
		return backend.Record{}, false, err
	}
	return b.queryOne(ctx, b.q.get, []any{key})
}

// Forget judges the lease by the server's clock. A key whose row a
// transaction still open holds (a RunOnceTx taking over an expired
// record) is refused with an error matching idem.ErrInProgress if the
// server's statement_timeout or lock_timeout cuts the wait for it short.
func (b *Backend) Forget(ctx context.Context, key string, _ time.Time) error {
	if err := b.nested(ctx); err != nil {
		return err
	}
	tag, err := b.exec(ctx, b.q.forget, key)
	if waitedOut(ctx, err) {
		return fmt.Errorf("%w: key %q is held by a transaction still open (%w)", idem.ErrInProgress, key, err)
	}
	if err != nil || tag.RowsAffected() > 0 {
		return err
	}
	exists, err := retried(ctx, func() (exists bool, err error) {
		err = b.onConn(ctx, func(ctx context.Context, q querier) error {
			return q.QueryRow(ctx, b.q.exists, key).Scan(&exists)
		})
		return exists, err
	})
	if err != nil {
		return err
	}
	if exists {
		return fmt.Errorf("%w: key %q is claimed and its lease holds", idem.ErrInProgress, key)
	}
	return nil
}

// reaimRounds bounds the re-aiming rounds of one Sweep: at most that many
// times limit rows are moved along the index.
const reaimRounds = 8

// Sweep judges expiry by the server's clock.
func (b *Backend) Sweep(ctx context.Context, _ time.Time, limit int) (int, error) {
	if err := b.nested(ctx); err != nil {
		return 0, err
	}
	if limit <= 0 {
		return 0, nil // PostgreSQL refuses a negative LIMIT
	}
	tag, err := b.exec(ctx, b.q.sweep, limit)
	if err != nil {
		return 0, err
	}
	n := int(tag.RowsAffected())
	// Fewer than limit were due: re-aim the rows the index holds too
	// early (or not at all), and sweep those of them that are due; a few
	// rounds, so that re-aiming keeps up with the rows turning early
	// (helper-38: one round a sweep fell behind, and every sweep read the
	// pile), and a bounded number, since re-aimed rows are not counted.
	for round := 0; n < limit && round < reaimRounds; round++ {
		if tag, err = b.exec(ctx, b.q.reaim, limit-n); err != nil || tag.RowsAffected() == 0 {
			return n, err
		}
		if tag, err = b.exec(ctx, b.q.sweep, limit-n); err != nil {
			return n, err
		}
		n += int(tag.RowsAffected())
	}
	return n, nil
}

// exec runs a statement, retried on a conflict.
func (b *Backend) exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return retried(ctx, func() (tag pgconn.CommandTag, err error) {
		err = b.onConn(ctx, func(ctx context.Context, q querier) (err error) {
			tag, err = q.Exec(ctx, sql, args...)
			return err
		})
		return tag, err
	})
}

// scanOne reads the one record rows may hold, after any leading columns
// given as extra destinations, and closes rows.
func scanOne(rows pgx.Rows, extra ...any) (backend.Record, bool, error) {
	defer rows.Close()
	return scanNext(rows, extra...)
}

// scanNext reads the next record of rows, if there is one.
func scanNext(rows pgx.Rows, extra ...any) (backend.Record, bool, error) {
	var r row
	return scanInto(rows, &r, extra)
}

// scanInto is scanNext reading into r, whose key and token, if set, are
// taken for the row's where they are the same (see row).
func scanInto(rows pgx.Rows, r *row, extra []any) (backend.Record, bool, error) {
	if !rows.Next() {
		return backend.Record{}, false, rows.Err()
	}
	if err := scanRow(rows, r, extra); err != nil {
		return backend.Record{}, false, err
	}
	rec := r.rec
	if len(r.fp) != len(rec.Fingerprint) {
		return backend.Record{}, false, fmt.Errorf("postgres: key %q: fingerprint of %d bytes", rec.Key, len(r.fp))
	}
	var err error
	if rec.Steps, err = backend.ReadSteps(r.steps); err != nil {
		return backend.Record{}, false, fmt.Errorf("postgres: key %q: %w", rec.Key, err)
	}
	copy(rec.Fingerprint[:], r.fp)
	if r.state < int16(backend.StatePending) || r.state > int16(backend.StateInterrupted) {
		// A later version's state, or a damaged row: not a record to act
		// on (a Resolve would take it for interrupted and write over it).
		return backend.Record{}, false, fmt.Errorf("postgres: key %q: unknown state %d", rec.Key, r.state)
	}
	rec.State = backend.RecordState(r.state)
	if rec.State == backend.StateCompleted && r.expires == nil {
		return backend.Record{}, false, fmt.Errorf("postgres: key %q: a completed record without an expiry", rec.Key)
	}
	if r.expires != nil {
		rec.ExpiresAt = *r.expires
	}
	if r.lease != nil {
		rec.LeaseUntil = *r.lease
	}
	return rec, true, rows.Err()
}

// Each calls fn for every record, in key order, stopping at fn's first
// error. It reads a page of records per query, by key from where the last
// ended, and calls fn once the page's rows are closed: fn may use the
// pool, however small, and a listing of millions holds no snapshot open.
func (b *Backend) Each(ctx context.Context, fn func(backend.Record) error) error {
	if err := b.nested(ctx); err != nil {
		return err
	}
	return paging.Each(ctx, b.page, fn)
}

// page reads up to limit records with keys after after, in key order.
func (b *Backend) page(ctx context.Context, after string, limit int) ([]backend.Record, error) {
	return retried(ctx, func() ([]backend.Record, error) { return b.readPage(ctx, after, limit) })
}

func (b *Backend) readPage(ctx context.Context, after string, limit int) ([]backend.Record, error) {
	var page []backend.Record
	err := b.onConn(ctx, func(ctx context.Context, q querier) error {
		rows, err := q.Query(ctx, b.q.page, after, limit)
		if err != nil {
			return err
		}
		defer rows.Close()
		for {
			rec, ok, err := scanNext(rows)
			if err != nil || !ok {
				return err
			}
			page = append(page, rec)
		}
	})
	return page, err
}
