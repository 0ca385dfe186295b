package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/internal/txrun"
)

// RunOnceTx is the transactional mode, for an operation whose effects are
// writes to the same database: it runs fn at most once for key, with the key's record, fn's
// own writes (through tx) and the outcome committed in one transaction. A
// crash, an error from fn or a panic rolls all of it back, so there is never
// a key without its writes, nor writes without their key; only a success, or
// an error marked idem.Final, commits (a final error commits the key and its
// error, but rolls fn's writes back).
//
// A duplicate in this process waits for the first call's outcome, as with
// RunOnce (the key is claimed in this process's memory before the
// transaction begins); one in another process blocks on the
// table's primary key until the first transaction ends, then replays its
// outcome, or runs fn itself if the first rolled back. A server whose
// statement_timeout or lock_timeout cuts that wait short does not end it:
// the claim is sent again, in a new transaction, for as long as the
// duplicate's execution may last (the store's ExecutionTimeout), while its
// caller waits under its own ctx, as below. A key reused with
// another payload is idem.ErrPayloadMismatch; a key held by an ordinary,
// non-transactional RunOnce elsewhere is idem.ErrInProgress or, if its lease
// lapsed, idem.ErrOutcomeUnknown.
//
// fn and the transaction run under a context that keeps ctx's values but
// not its cancellation, bounded by the store's ExecutionTimeout. The caller waits under its own
// ctx: if ctx ends first, RunOnceTx returns an error that matches both
// idem.ErrInProgress and ctx.Err(), and the transaction goes on for the
// duplicates waiting on it.
//
// store supplies the fingerprint, codec and TTL; its Backend must be
// a *Backend, whose table holds the key. fn must do its writes through tx,
// and must not commit or roll it back: one that commits it anyway commits
// its writes with a claim whose lease has lapsed, so the key reads as
// interrupted (idem.ErrOutcomeUnknown until Resolve or Forget settles it),
// never as claimed for ever. A RunOnceTx called with fn's ctx on the same
// pool is refused (backend.ErrRefused), and so is every call of the
// Backend (a claim, Forget, Resolve, a listing) made with it on a pool of
// one connection, which fn's transaction holds: it would wait for that
// connection for ever, fn's ctx not ending with its caller's.
func RunOnceTx[R any](ctx context.Context, store *idem.Store[R], key string, payload any, fn func(ctx context.Context, tx pgx.Tx) (R, error)) (R, error) {
	var zero R
	if store == nil {
		return zero, errors.New("postgres: RunOnceTx with a nil store")
	}
	opts := txrun.Of(store).Options()
	b, ok := opts.Backend.(*Backend)
	switch {
	case !ok:
		return zero, fmt.Errorf("postgres: RunOnceTx needs a store whose Backend is a *postgres.Backend, not %T", opts.Backend)
	case fn == nil:
		return zero, errors.New("postgres: RunOnceTx with a nil fn")
	case ctx != nil && ctx.Value(inTx{}) == b.pool:
		// Before the key is claimed in memory: a nested call must not wait
		// on itself, nor on a second connection a pool of one never has.
		return zero, backend.Refuse(errNested)
	}
	return txrun.Run(ctx, store, key, payload, func(ctx context.Context, fp idem.Fingerprint) (R, error, bool) {
		return runOnceTx(ctx, store, b, key, fp, fn)
	})
}

// errNested is returned by RunOnceTx called with the ctx of another
// RunOnceTx's fn over the same pool, and by a claim (RunOnce, Begin) made
// so when the pool has one connection: fn's transaction holds a
// connection until fn returns, and the nested call would wait for another
// (for ever, on a pool of one).
var errNested = errors.New("postgres: called from inside RunOnceTx's fn, whose transaction holds a connection: use its pgx.Tx")

// inTx is the context key that marks the context of an fn running in a
// transaction on the pool it holds.
type inTx struct{}

// runOnceTx claims key in a transaction of its own and, if it won the
// claim, runs fn in it; otherwise it answers from the record that stands
// (replayed, for a recorded outcome).
func runOnceTx[R any](ctx context.Context, store *idem.Store[R], b *Backend, key string, fp idem.Fingerprint, fn func(context.Context, pgx.Tx) (R, error)) (_ R, _ error, replayed bool) {
	var zero R
	// The claim's lease has lapsed already (lease -1: lease_until is the
	// claim's own instant): the claim is never seen outside this
	// transaction, which commits it with its outcome or not at all; were it
	// ever committed without one (fn ran COMMIT), it would read as
	// interrupted, which Forget and Resolve settle, not as a claim that
	// holds for ever.
	claim := backend.Record{Key: key, Fingerprint: fp, Token: txrun.Token(), State: backend.StatePending}
	ttl := txrun.Of(store).Options().TTL
	b.learn(ttl)
	args := []any{key, fp[:], claim.Token, -1, micros(ttl)}
	// A duplicate waits on the row of the transaction that holds the key
	// until that transaction ends, however often the server's
	// statement_timeout or lock_timeout cuts the wait short: each time, in
	// a transaction afresh (awaited).
	c, err := awaited(ctx, func() (claimedTx, error) { return beginClaim(ctx, b, key, args) })
	if err != nil {
		return zero, &idem.BackendError{Op: "claim", Err: err}, false
	}
	defer c.tx.Rollback(context.WithoutCancel(ctx)) // a no-op once committed
	if c.won {
		val, err := runTx(ctx, store, b, c.tx, claim, fn)
		return val, err, false
	}
	return txrun.Answer(store, c.rec, fp)
}

// A claimedTx is a transaction that holds a claim, or the record that
// stood.
type claimedTx struct {
	tx  pgx.Tx
	rec backend.Record
	won bool
}

// beginClaim begins a transaction and claims key in it (claimTx). If the
// claim fails, the transaction is rolled back.
func beginClaim(ctx context.Context, b *Backend, key string, args []any) (claimedTx, error) {
	// Read committed, whatever the server's default: a duplicate must see
	// the row the first transaction committed once it stops waiting on it.
	tx, err := b.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return claimedTx{}, err
	}
	rec, won, err := claimTx(ctx, tx, b, key, args)
	if err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return claimedTx{}, err
	}
	return claimedTx{tx, rec, won}, nil
}

// testHookBeforeTakeover, if set, runs between finding an expired record and
// taking it over. Tests use it to sweep the record away in between.
var testHookBeforeTakeover func()

// claimTx claims key inside tx, or returns the record that stands. Each
// statement sees the rows committed before it: a row that a concurrent
// transaction committed, took over or deleted (a sweep, a Forget) between
// two statements is met by trying again, as Backend.Claim does.
func claimTx(ctx context.Context, tx pgx.Tx, b *Backend, key string, args []any) (backend.Record, bool, error) {
	for range 8 {
		rows, err := tx.Query(ctx, b.q.claim, args...)
		if err != nil {
			return backend.Record{}, false, err
		}
		var won, expired bool
		rec, found, err := scanOne(rows, &won, &expired)
		switch {
		case err != nil:
			return backend.Record{}, false, err
		case found && (won || !expired):
			return rec, won, nil
		case found: // expired: take it over, unless another claim did first
			if testHookBeforeTakeover != nil {
				testHookBeforeTakeover()
			}
			if rows, err = tx.Query(ctx, b.q.takeOver, args...); err != nil {
				return backend.Record{}, false, err
			}
			if rec, found, err = scanOne(rows, &won, &expired); err != nil || found {
				return rec, found && won, err
			}
		}
		// A conflicting row was committed after the statement's snapshot,
		// or the expired row went before the takeover reached it: read
		// what stands now, and claim again if nothing does.
		if rows, err = tx.Query(ctx, b.q.get, key); err != nil {
			return backend.Record{}, false, err
		}
		if rec, found, err = scanOne(rows); err != nil || found {
			return rec, false, err
		}
	}
	return backend.Record{}, false, fmt.Errorf("key %q: claimed and released under this transaction 8 times in a row", key)
}

// runTx runs fn in a savepoint of tx, which holds the new claim, and commits
// the outcome, or rolls everything back.
func runTx[R any](ctx context.Context, store *idem.Store[R], b *Backend, tx pgx.Tx, claim backend.Record, fn func(context.Context, pgx.Tx) (R, error)) (val R, err error) {
	opts := txrun.Of(store).Options()
	savepoint, err := tx.Begin(ctx)
	if err != nil {
		return val, &idem.BackendError{Op: "claim", Err: err}
	}
	// A panic in fn goes up to Ticket.Do, which reports it; the deferred
	// rollback takes the key and fn's writes away, as for an error.
	val, err = fn(context.WithValue(ctx, inTx{}, b.pool), savepoint)
	if err != nil && !idem.IsFinal(err) {
		return val, err
	}
	if err != nil { // final: keep the key and the error, not fn's writes
		if rerr := savepoint.Rollback(ctx); rerr != nil {
			return val, txrun.Unrecorded(err, rerr)
		}
	} else if cerr := savepoint.Commit(ctx); cerr != nil {
		return val, cerr
	}
	done := claim
	if eerr := txrun.Of(store).Encode(&done, val, err); eerr != nil {
		return val, txrun.Unrecorded(err, eerr)
	}
	var xid int64
	if cerr := tx.QueryRow(ctx, b.q.completeTx, done.Key, done.Token, micros(opts.TTL), done.Value, done.Failed, done.ErrMsg).Scan(&xid); cerr != nil {
		return val, txrun.Unrecorded(err, cerr)
	}
	if cerr := tx.Commit(ctx); cerr != nil && !committed(ctx, b, opts, xid, done) {
		return val, txrun.Unrecorded(err, fmt.Errorf("postgres: committing: %w", cerr))
	}
	return val, err
}

// committed reports whether transaction xid, whose COMMIT failed, took
// effect after all: the reply to a COMMIT can be lost. The server knows:
// txid_status says committed, aborted, or in progress (a COMMIT still being
// applied, asked about again until Options.SettleTimeout). When it no
// longer knows (the id is too old), the claim's token, unique to the
// transaction, tells whether its outcome is in the table.
func committed(ctx context.Context, b *Backend, opts idem.Options, xid int64, done backend.Record) bool {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), opts.SettleTimeout)
	defer cancel()
	for wait := 10 * time.Millisecond; ; wait = min(2*wait, time.Second) {
		var status *string
		err := b.pool.QueryRow(ctx, `SELECT txid_status($1)`, xid).Scan(&status)
		switch {
		case err == nil && status == nil:
			rec, ok, err := b.Get(ctx, done.Key, time.Time{})
			return err == nil && ok && rec.Token == done.Token && rec.State == backend.StateCompleted
		case err == nil && *status != "in progress":
			return *status == "committed"
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(wait):
		}
	}
}
