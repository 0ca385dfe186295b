package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/internal/txrun"
)

// RunOnceTx is the transactional mode, for an operation whose effects are
// writes to the same database: it runs fn at most once for key, with the key's record, fn's
// own writes (through tx) and the outcome committed in one SQLite
// transaction. A crash, an error from fn or a panic rolls all of it back, so
// there is never a key without its writes, nor writes without their key,
// and the key is free for the next call rather than interrupted. Only a
// success, or an error marked idem.Final, commits (a final error commits
// the key and its error, but rolls fn's writes back).
//
// A duplicate in this process waits for the first call's outcome, as with
// RunOnce (the key is claimed in this process's memory before the
// transaction begins); one in another process waits on
// SQLite's write lock until the first transaction ends, then replays its
// outcome, or runs fn itself if the first rolled back. A key reused with
// another payload is idem.ErrPayloadMismatch; a key held by an ordinary,
// non-transactional RunOnce is idem.ErrInProgress or, if its lease lapsed,
// idem.ErrOutcomeUnknown.
//
// SQLite has one writer: the transaction holds the database's write lock
// from its first statement until it commits, so every other write, in this
// process or another, waits for fn. Keep fn to the database work; call
// remote services before or after, not inside. fn and the transaction run
// under a context that keeps ctx's values but not its cancellation,
// bounded by the store's ExecutionTimeout. The caller waits under its own
// ctx: if ctx ends first, RunOnceTx returns an error that matches both
// idem.ErrInProgress and ctx.Err(), and the transaction goes on for the
// duplicates waiting on it.
//
// store supplies the fingerprint, codec and TTL; its Backend must be a
// *Backend, whose table holds the key. fn must do its writes through tx,
// and must not commit or roll it back. SQLite ends a transaction by itself
// on some errors (a trigger's RAISE(ROLLBACK), INSERT OR ROLLBACK, a full
// disk); with modernc.org/sqlite, a commit hook then keeps whatever fn
// writes afterwards from committing on its own, and the call fails with
// nothing committed (with another driver, fn must return such errors). A
// write of the Backend's from inside fn, with the ctx fn is given, is
// refused rather than left to wait for the lock fn's transaction holds, and
// so is a read (a Get, a listing) on a pool of one connection
// (SetMaxOpenConns(1)), which fn's transaction holds; a RunOnce of fn's
// own key waits for itself, as with RunOnce.
func RunOnceTx[R any](ctx context.Context, store *idem.Store[R], key string, payload any, fn func(ctx context.Context, tx *sql.Tx) (R, error)) (R, error) {
	var zero R
	if store == nil {
		return zero, errors.New("sqlite: RunOnceTx with a nil store")
	}
	opts := txrun.Of(store).Options()
	b, ok := opts.Backend.(*Backend)
	switch {
	case !ok:
		return zero, fmt.Errorf("sqlite: RunOnceTx needs a store whose Backend is a *sqlite.Backend, not %T", opts.Backend)
	case fn == nil:
		return zero, errors.New("sqlite: RunOnceTx with a nil fn")
	}
	return txrun.Run(ctx, store, key, payload, func(ctx context.Context, fp idem.Fingerprint) (R, error, bool) {
		return runOnceTx(ctx, store, b, key, fp, fn)
	})
}

// runOnceTx claims key in a transaction and, if it won the claim, runs fn
// in it; otherwise it answers from the record that stands (replayed, for a
// recorded outcome).
func runOnceTx[R any](ctx context.Context, store *idem.Store[R], b *Backend, key string, fp idem.Fingerprint, fn func(context.Context, *sql.Tx) (R, error)) (_ R, _ error, replayed bool) {
	var zero R
	if err := b.lock(ctx); err != nil {
		return zero, err, false
	}
	defer b.unlock()
	conn, err := b.db.Conn(ctx)
	if err != nil {
		return zero, &idem.BackendError{Op: "claim", Err: closedErr(err)}, false
	}
	defer conn.Close()
	guard := guardCommits(conn)
	defer guard.remove()
	// The claim's lease has lapsed already: the claim is never seen
	// outside this transaction, which commits it with its outcome or not at
	// all; were it ever committed without one, it would read as interrupted,
	// not as a claim that holds for ever. The claim is the first statement,
	// and writes, so the transaction holds the write lock from here to its
	// end. Another process's transaction may hold that lock for longer than
	// the busy timeout: the claim waits on, as a duplicate in this process
	// would, for as long as the work's context lasts (its caller leaves
	// earlier, on its own ctx).
	now := txrun.Of(store).Options().Now()
	claim := backend.Record{Key: key, Fingerprint: fp, Token: txrun.Token(), State: backend.StatePending, CreatedAt: now}
	var tx *sql.Tx
	var rec backend.Record
	var won bool
	err = whileBusy(ctx, func() error {
		if tx, err = conn.BeginTx(ctx, nil); err != nil {
			return err
		}
		if rec, won, err = b.claimIn(ctx, tx, key, fp, claim.Token, now, now); err != nil {
			tx.Rollback()
		}
		return err
	})
	if err == nil {
		defer tx.Rollback() // a no-op once committed
	}
	switch {
	case err != nil:
		return zero, claimErr(err), false
	case won:
		val, err := runTx(context.WithValue(ctx, inTx{}, b), store, b, tx, guard, claim, fn)
		return val, err, false
	}
	rec, _ = rec.SeenAt(now)
	return txrun.Answer(store, rec, fp)
}

// runTx runs fn in a savepoint of tx, which holds the new claim, and commits
// the outcome, or rolls everything back.
func runTx[R any](ctx context.Context, store *idem.Store[R], b *Backend, tx *sql.Tx, guard *commitGuard, claim backend.Record, fn func(context.Context, *sql.Tx) (R, error)) (val R, err error) {
	opts := txrun.Of(store).Options()
	if _, err := tx.ExecContext(ctx, `SAVEPOINT idem_fn`); err != nil {
		return val, &idem.BackendError{Op: "claim", Err: closedErr(err)}
	}
	// A panic in fn goes up to Ticket.Do, which reports it; the deferred
	// rollback takes the key and fn's writes away, as for an error.
	val, err = fn(ctx, tx)
	if err != nil && !idem.IsFinal(err) {
		return val, err
	}
	if err != nil { // final: keep the key and the error, not fn's writes
		if _, rerr := tx.ExecContext(ctx, `ROLLBACK TO idem_fn`); rerr != nil {
			return val, txrun.Unrecorded(err, ended(rerr))
		}
	}
	if _, rerr := tx.ExecContext(ctx, `RELEASE idem_fn`); rerr != nil {
		return val, txrun.Unrecorded(err, ended(rerr))
	}
	done := claim
	if eerr := txrun.Of(store).Encode(&done, val, err); eerr != nil {
		return val, txrun.Unrecorded(err, eerr)
	}
	// One row, or fn took the claim away (deleted or rewrote its row):
	// committing then would keep fn's writes without the key.
	n, cerr := b.execIn(ctx, tx, b.q.complete, done.Key, done.Token, opts.Now().Add(opts.TTL).UnixNano(), done.Value, done.Failed, done.ErrMsg)
	if cerr == nil && n != 1 {
		cerr = errClaimGone
	}
	if cerr != nil {
		return val, txrun.Unrecorded(err, cerr)
	}
	guard.allow.Store(true)
	if cerr := tx.Commit(); cerr != nil && !committed(ctx, b, opts, done) {
		return val, txrun.Unrecorded(err, fmt.Errorf("sqlite: committing: %w", closedErr(cerr)))
	}
	return val, err
}

// errClaimGone is returned when fn deleted or rewrote the claim's row: the
// transaction rolls back, fn's writes with it.
var errClaimGone = errors.New("sqlite: RunOnceTx's claim row was changed or deleted inside fn, so nothing was committed")

// claimErr is the error of a claim that failed: a database locked for
// longer than the busy timeout is held by a transaction in another
// process, most likely a RunOnceTx of this very key, so the key is in
// progress there.
func claimErr(err error) error {
	if busy(err) {
		return fmt.Errorf("%w: the database is locked by another transaction: %w", idem.ErrInProgress, err)
	}
	return &idem.BackendError{Op: "claim", Err: closedErr(err)}
}

// ended explains the failure of a savepoint statement after fn: SQLite
// ended the transaction itself, and the commit guard kept anything fn
// wrote after that from committing on its own.
func ended(err error) error {
	return fmt.Errorf("sqlite: the transaction ended inside fn (SQLite rolls it back on some errors: a trigger's RAISE(ROLLBACK), INSERT OR ROLLBACK, a full disk, an interrupt; or fn ended it), so nothing was committed: %w", closedErr(err))
}

// committed reports whether a transaction whose COMMIT returned an error
// took effect after all: an I/O error can come after the log was written.
// The claim's token, unique to the transaction, tells whether its outcome
// is in the table.
func committed(ctx context.Context, b *Backend, opts idem.Options, done backend.Record) bool {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), opts.SettleTimeout)
	defer cancel()
	rec, ok, err := scanOne(b.query(ctx, nil, b.q.get, done.Key))
	return err == nil && ok && rec.CompletedBy(done.Token)
}
