package mysql

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/internal/txrun"
)

// RunOnceTx is the transactional mode, for an operation whose effects are
// writes to the same database: it runs fn at most once for key, with the key's record, fn's
// own writes (through tx) and the outcome committed in one InnoDB
// transaction. A crash, an error from fn or a panic rolls all of it back,
// so there is never a key without its writes, nor writes without their
// key; only a success, or an error marked idem.Final, commits (a final
// error commits the key and its error, but rolls fn's writes back). fn's
// tables must be InnoDB: MyISAM ignores transactions.
//
// A duplicate in this process waits for the first call's outcome, as with
// RunOnce (the key is claimed in this process's memory before the
// transaction begins); one in another process blocks on the
// table's primary key until the first transaction ends, then replays its
// outcome, or runs fn itself if the first rolled back. A key reused with
// another payload is idem.ErrPayloadMismatch; a key held by an ordinary,
// non-transactional RunOnce elsewhere is idem.ErrInProgress or, if its lease
// lapsed, idem.ErrOutcomeUnknown.
//
// fn and the transaction run under a context that keeps ctx's values but
// not its cancellation, bounded by the store's ExecutionTimeout. The caller
// waits under its own ctx: if ctx ends first, RunOnceTx returns an error
// that matches both idem.ErrInProgress and ctx.Err(), and the transaction
// goes on for the duplicates waiting on it. The transaction is READ
// COMMITTED; a duplicate that waits longer than innodb_lock_wait_timeout,
// or than the server's max_statement_time (MariaDB) or max_execution_time
// (MySQL), begins again, until its work's context ends.
//
// The transaction runs on a connection held for it alone, with autocommit
// off: a transaction the server ends without fn ending it (InnoDB rolls a
// deadlock victim back whole, claim included) leaves fn's later statements
// through tx in a transaction of their own, which is rolled back, never
// committed one by one without the key. fn may SET the session's
// timestamp (NOW() and UTC_TIMESTAMP() follow it): the outcome's expiry
// does not, as it runs from the claim's instant, which the server made
// before fn ran, plus the time fn took, on this process's monotonic
// clock, plus the TTL. Before the connection goes back to the pool, its
// transaction is rolled back, autocommit turned on again and the
// session's timestamp reset; a connection whose transaction fn ended
// (or LOCK TABLES, which ends it) is closed instead. Other session
// settings fn changes stay on the pooled connection, as on any *sql.Tx's.
//
// store supplies the fingerprint, codec and TTL; its Backend must be a
// *Backend, whose table holds the key. fn must do its writes through tx,
// and must not commit or roll it back, nor SET autocommit = 1, nor run
// DDL, which MySQL commits implicitly: a transaction so ended commits the claim, whose lease has
// lapsed already, so the key reads as interrupted (idem.ErrOutcomeUnknown
// until Resolve or Forget settles it), never as claimed for ever, and the
// call fails. A RunOnceTx called with fn's ctx on the same *sql.DB is
// refused (backend.ErrRefused), and so is every call of the Backend
// (a claim, Forget, Resolve, a listing) made with it on a pool of one
// connection (SetMaxOpenConns(1)), which fn's transaction holds: it would
// wait for that connection for ever, fn's ctx not ending with its
// caller's.
func RunOnceTx[R any](ctx context.Context, store *idem.Store[R], key string, payload any, fn func(ctx context.Context, tx *sql.Tx) (R, error)) (R, error) {
	var zero R
	if store == nil {
		return zero, errors.New("mysql: RunOnceTx with a nil store")
	}
	opts := txrun.Of(store).Options()
	b, ok := opts.Backend.(*Backend)
	switch {
	case !ok:
		return zero, fmt.Errorf("mysql: RunOnceTx needs a store whose Backend is a *mysql.Backend, not %T", opts.Backend)
	case fn == nil:
		return zero, errors.New("mysql: RunOnceTx with a nil fn")
	case ctx != nil && ctx.Value(inTx{}) == b.db:
		// Before the key is claimed in memory: a nested call must not wait
		// on itself, nor on a second connection a pool of one never has.
		return zero, backend.Refuse(errNested)
	}
	return txrun.Run(ctx, store, key, payload, func(ctx context.Context, fp idem.Fingerprint) (R, error, bool) {
		return runOnceTx(ctx, store, b, key, fp, fn)
	})
}

// errNested is returned by RunOnceTx called with the ctx of another
// RunOnceTx's fn over the same *sql.DB, and by a claim (RunOnce, Begin)
// made so when the pool has one connection: fn's transaction holds a
// connection until fn returns, and the nested call would wait for another
// (for ever, on a pool of one).
var errNested = errors.New("mysql: called from inside RunOnceTx's fn, whose transaction holds a connection: use its *sql.Tx")

// errClaimGone is returned when fn deleted or rewrote the claim's row: the
// transaction rolls back, fn's writes with it.
var errClaimGone = errors.New("mysql: RunOnceTx's claim row was changed or deleted inside fn, so nothing was committed")

// inTx is the context key that marks the context of an fn running in a
// transaction on the *sql.DB it holds.
type inTx struct{}

// runOnceTx claims key in a transaction of its own and, if it won the
// claim, runs fn in it; otherwise it answers from the record that stands
// (replayed, for a recorded outcome).
func runOnceTx[R any](ctx context.Context, store *idem.Store[R], b *Backend, key string, fp idem.Fingerprint, fn func(context.Context, *sql.Tx) (R, error)) (_ R, _ error, replayed bool) {
	var zero R
	// The claim's lease has lapsed already (lease -1: lease_until is a
	// microsecond before the claim's instant): the claim is never seen
	// outside this transaction, which commits it with its outcome or not
	// at all; were it ever committed without one (fn ran COMMIT, or DDL),
	// it would read as interrupted, which Forget and Resolve settle, not
	// as a claim that holds for ever.
	claim := backend.Record{Key: key, Fingerprint: fp, Token: txrun.Token(), State: backend.StatePending}
	sess, err := b.openSession(ctx)
	if err != nil {
		return zero, &idem.BackendError{Op: "claim", Err: err}, false
	}
	// settled: this call's own COMMIT or ROLLBACK ended the transaction.
	var settled bool
	defer func() { sess.release(ctx, txrun.Of(store).Options().SettleTimeout, settled) }()
	var (
		tx  *sql.Tx
		rec found
		// start is before the claim statement: the claim's instant, the
		// server's, is after it, and start's monotonic reading measures
		// at least the time since.
		start time.Time
	)
	// A deadlock rolls the whole transaction back, and a lock wait that
	// timed out the statement: either way, begin again.
	_, err = retried(ctx, func() (struct{}, error) {
		var err error
		start = time.Now()
		if tx, err = sess.conn.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted}); err != nil {
			return struct{}{}, err
		}
		if rec, err = claimTx(ctx, tx, b, []byte(key), fp[:], []byte(claim.Token), &sess.id); err != nil {
			sess.rollback(tx)
		}
		return struct{}{}, err
	})
	if err != nil {
		sess.spoiled = true
		return zero, &idem.BackendError{Op: "claim", Err: err}, false
	}
	defer func() {
		if !settled { // else committed
			settled = sess.ended(tx)
		}
	}()
	if rec.rec.Token == claim.Token {
		val, err := runTx(ctx, store, b, sess, tx, claim, start, fn, &settled)
		return val, err, false
	}
	return txrun.Answer(store, rec.rec, fp)
}

// claimTx claims key inside tx, or returns the record that stands, and
// the session's id. Each statement sees the rows committed before it: a
// row that a concurrent transaction committed, took over or deleted (a
// sweep, a Forget) between two statements is met by trying again, as
// Backend.Claim does.
func claimTx(ctx context.Context, tx *sql.Tx, b *Backend, key, fp, token []byte, conn *int64) (found, error) {
	for range 8 {
		var f found
		var err error
		if b.returning {
			f, err = queryOne(ctx, tx, b.q.claimTx, []any{key, fp, token, -1}, conn)
		} else if _, err = tx.ExecContext(ctx, b.q.insert, key, fp, token, -1); err == nil {
			f, err = queryOne(ctx, tx, b.q.getTx, []any{key}, conn)
		}
		switch {
		case err != nil:
			return found{}, err
		case f.ok && !f.expired:
			return f, nil
		case f.ok: // expired: take it over, unless another claim did first
			if _, err := tx.ExecContext(ctx, b.q.takeOver, fp, token, -1, key); err != nil {
				return found{}, err
			}
		}
	}
	return found{}, fmt.Errorf("key %q: claimed and released under this transaction 8 times in a row", key)
}

// runTx runs fn in a savepoint of tx, which holds the new claim, made
// after start, and commits the outcome, or rolls everything back; settled
// says whether its COMMIT was answered.
//
// The outcome's expiry is not the session's now after fn: fn may have SET
// the session's timestamp, which UTC_TIMESTAMP follows, and a clock set
// back a TTL would record an outcome expired already, and the next call
// would run fn again. It is the claim's instant, made by the server
// before fn ran, plus the time since start on this process's monotonic
// clock (a duration, which travels), plus the TTL.
func runTx[R any](ctx context.Context, store *idem.Store[R], b *Backend, sess *session, tx *sql.Tx, claim backend.Record, start time.Time, fn func(context.Context, *sql.Tx) (R, error), settled *bool) (val R, err error) {
	opts := txrun.Of(store).Options()
	if _, err := tx.ExecContext(ctx, `SAVEPOINT `+savepoint); err != nil {
		sess.spoiled = true
		return val, &idem.BackendError{Op: "claim", Err: err}
	}
	// A panic in fn goes up to Ticket.Do, which reports it; the deferred
	// rollback takes the key and fn's writes away, as for an error. fn's
	// ctx is marked as holding a connection of b.db (Backend.nested);
	// this function's own statements after it, settling a lost COMMIT
	// reply on a pool of one included, are not fn's.
	val, err = fn(context.WithValue(ctx, inTx{}, b.db), tx)
	if err != nil && !idem.IsFinal(err) {
		return val, err
	}
	if err != nil { // final: keep the key and the error, not fn's writes
		if _, rerr := tx.ExecContext(ctx, `ROLLBACK TO SAVEPOINT `+savepoint); rerr != nil {
			sess.spoiled = true
			return val, txrun.Unrecorded(err, ended(rerr))
		}
	}
	if _, rerr := tx.ExecContext(ctx, `RELEASE SAVEPOINT `+savepoint); rerr != nil {
		sess.spoiled = true
		return val, txrun.Unrecorded(err, ended(rerr))
	}
	done := claim
	if eerr := txrun.Of(store).Encode(&done, val, err); eerr != nil {
		return val, txrun.Unrecorded(err, eerr)
	}
	if ferr := b.fits(done.Key, len(done.Value)+len(done.ErrMsg)); ferr != nil {
		return val, txrun.Unrecorded(err, ferr)
	}
	// One row, or fn took the claim away (deleted or rewrote its row):
	// committing then would keep fn's writes without the key.
	res, cerr := tx.ExecContext(ctx, b.q.completeTx, micros(time.Since(start))+micros(opts.TTL), done.Value, done.Failed, []byte(done.ErrMsg), []byte(done.Key), []byte(done.Token))
	if cerr == nil {
		var n int64
		if n, cerr = res.RowsAffected(); cerr == nil && n != 1 {
			cerr = errClaimGone
		}
	}
	if cerr != nil {
		return val, txrun.Unrecorded(err, b.oversized(explained(cerr), len(done.Value)+len(done.ErrMsg)))
	}
	cerr = tx.Commit()
	*settled = cerr == nil
	if cerr != nil && !committed(ctx, b, opts, sess, done, cerr) {
		return val, txrun.Unrecorded(err, fmt.Errorf("mysql: committing: %w", cerr))
	}
	return val, err
}

// ended explains the failure of a savepoint statement after fn: the
// transaction had ended (fn committed or rolled it back, or ran DDL, which
// commits), and the claim with it.
func ended(err error) error {
	return fmt.Errorf("mysql: the transaction ended inside fn (a deadlock or a ROLLBACK rolls it back, with the key and fn's writes; a COMMIT, SET autocommit = 1, LOCK TABLES or DDL commits them), so the outcome was not recorded; if fn's writes committed, the key is left interrupted: %w", err)
}

// committed reports whether the transaction of sess, whose COMMIT failed
// with err, took effect after all: the reply to a COMMIT can be lost. A
// COMMIT never sent (the transaction had ended: ctx ran out, and
// database/sql rolled it back) did not. Once the session is gone on the
// server, what it committed is in the table, and the claim's token, unique
// to the transaction, tells whether its outcome is. A session the server
// still runs (it has not noticed its client is gone, or is still
// committing) is killed, which ends it once its statement does, and asked
// about again until Options.SettleTimeout. The session's connection is
// given up first, as a pool of one needs it for these questions; its
// server id stays this transaction's, since servers do not soon reuse a
// thread id, and the connection held until now was no other caller's.
func committed(ctx context.Context, b *Backend, opts idem.Options, sess *session, done backend.Record, err error) bool {
	sess.spoiled = true
	if errors.Is(err, sql.ErrTxDone) || sess.id == 0 {
		return false
	}
	// Give the held connection up first: on a pool of one, the questions
	// below need it. Its server id stays this transaction's (MariaDB and
	// MySQL do not reuse a thread id soon).
	_ = sess.conn.Raw(func(any) error { return driver.ErrBadConn })
	_ = sess.conn.Close()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), opts.SettleTimeout)
	defer cancel()
	for wait := 10 * time.Millisecond; ; wait = min(2*wait, time.Second) {
		var alive bool
		// LIMIT 1 overrides a sql_select_limit of 0 that code sharing
		// the pool SET on a connection, under which no row comes back.
		err := b.db.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM information_schema.PROCESSLIST WHERE ID = ?) LIMIT 1`, sess.id).Scan(&alive)
		switch {
		case err == nil && !alive:
			rec, ok, err := b.Get(ctx, done.Key, time.Time{})
			return err == nil && ok && rec.CompletedBy(done.Token)
		case err == nil:
			// Unknown thread (1094) if it ended meanwhile: asked again.
			_, _ = b.db.ExecContext(ctx, `KILL CONNECTION `+fmt.Sprint(sess.id))
		}
		if pause(ctx, wait) != nil {
			return false
		}
	}
}
