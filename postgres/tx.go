package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
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
	defer c.end(context.WithoutCancel(ctx)) // rolls back, unless committed
	if c.won {
		val, err := runTx(ctx, store, b, c, claim, fn)
		return val, err, false
	}
	return txrun.Answer(store, c.rec, fp)
}

// A claimedTx is a connection whose transaction holds a claim (won, and
// xid is the transaction's id), or the record that stood.
//
// The transaction is not pgx's: its BEGIN goes in one round trip with the
// claim, and its COMMIT in one with the outcome (a pgx.Tx sends each on
// its own), so that a new key costs the caller's own transaction one
// round trip more, the savepoint fn runs in.
type claimedTx struct {
	conn *pgxpool.Conn
	rec  backend.Record
	won  bool
	xid  int64
}

// end rolls back the transaction, if still open, and gives the connection
// back to the pool. A connection whose rollback failed is in a state
// nobody knows: the pool closes any that is not idle.
func (c claimedTx) end(ctx context.Context) {
	if c.conn.Conn().PgConn().TxStatus() != 'I' {
		_, _ = c.conn.Exec(ctx, `rollback`)
	}
	c.conn.Release()
}

// beginClaim begins a transaction and claims key in it (claimTx). If the
// claim fails, the transaction is rolled back.
func beginClaim(ctx context.Context, b *Backend, key string, args []any) (claimedTx, error) {
	conn, err := b.pool.Acquire(ctx)
	if err != nil {
		return claimedTx{}, err
	}
	c := claimedTx{conn: conn}
	if c.rec, c.won, c.xid, err = claimTx(ctx, conn.Conn(), b, key, args); err != nil {
		c.end(context.WithoutCancel(ctx))
		return claimedTx{}, err
	}
	return c, nil
}

// testHookBeforeTakeover, if set, runs between finding an expired record and
// taking it over. Tests use it to sweep the record away in between.
var testHookBeforeTakeover func()

// claimTx begins a transaction on conn and claims key inside it, or
// returns the record that stands; a claim it won comes with the
// transaction's id, to ask about its COMMIT if the reply to that is lost.
// The BEGIN, the claim and the id go in one round trip. The transaction
// is read committed, whatever the server's default: a duplicate must see
// the row the first transaction committed once it stops waiting on it.
//
// Each statement sees the rows committed before it: a row that a
// concurrent transaction committed, took over or deleted (a sweep, a
// Forget) between two statements is met by trying again, as
// Backend.Claim does.
func claimTx(ctx context.Context, conn *pgx.Conn, b *Backend, key string, args []any) (backend.Record, bool, int64, error) {
	var (
		won, expired bool
		xid          *int64
		rec          backend.Record
		found        bool
	)
	batch := &pgx.Batch{}
	batch.Queue(`begin isolation level read committed`)
	batch.Queue(b.q.claim, args...)
	// NULL unless the claim wrote: an id is not given to a transaction
	// that only read (a replay), which would cost it a commit record.
	batch.Queue(`select txid_current_if_assigned()`)
	br := conn.SendBatch(ctx, batch)
	_, err := br.Exec()
	if err == nil {
		var rows pgx.Rows
		if rows, err = br.Query(); err == nil {
			rec, found, err = scanOne(rows, &won, &expired)
		}
	}
	if err == nil {
		err = br.QueryRow().Scan(&xid)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	for i := range 8 {
		if i > 0 {
			var rows pgx.Rows
			if rows, err = conn.Query(ctx, b.q.claim, args...); err == nil {
				rec, found, err = scanOne(rows, &won, &expired)
			}
			xid = nil
		}
		switch {
		case err != nil:
			return backend.Record{}, false, 0, err
		case found && won:
			return takenWith(ctx, conn, rec, xid)
		case found && !expired:
			return rec, false, 0, nil
		case found: // expired: take it over, unless another claim did first
			if testHookBeforeTakeover != nil {
				testHookBeforeTakeover()
			}
			rows, err := conn.Query(ctx, b.q.takeOver, args...)
			if err != nil {
				return backend.Record{}, false, 0, err
			}
			if rec, found, err = scanOne(rows, &won, &expired); err != nil {
				return backend.Record{}, false, 0, err
			} else if found {
				return takenWith(ctx, conn, rec, nil)
			}
		}
		// A conflicting row was committed after the statement's snapshot,
		// or the expired row went before the takeover reached it: read
		// what stands now, and claim again if nothing does.
		rows, err := conn.Query(ctx, b.q.get, key)
		if err != nil {
			return backend.Record{}, false, 0, err
		}
		if rec, found, err = scanOne(rows); err != nil || found {
			return rec, false, 0, err
		}
	}
	return backend.Record{}, false, 0, fmt.Errorf("key %q: claimed and released under this transaction 8 times in a row", key)
}

// takenWith is a claim won, rec, with its transaction's id: xid, read with
// the claim, or else asked for (a claim won by a takeover, or on a later
// try, which are rare).
func takenWith(ctx context.Context, conn *pgx.Conn, rec backend.Record, xid *int64) (backend.Record, bool, int64, error) {
	if xid != nil {
		return rec, true, *xid, nil
	}
	var id int64
	if err := conn.QueryRow(ctx, `select txid_current()`).Scan(&id); err != nil {
		return backend.Record{}, false, 0, err
	}
	return rec, true, id, nil
}

// runTx runs fn in a savepoint of c's transaction, which holds the new
// claim, and commits the outcome, or rolls everything back.
//
// The savepoint is pgx's own transaction (its BEGIN the SAVEPOINT), which
// fn gets wrapped (fnTx) as a nested one; after fn, the savepoint's end
// (RELEASE, or ROLLBACK TO for a final error, which keeps the key, not
// fn's writes), the outcome and the COMMIT go in one round trip. A
// statement of it that fails stops the rest: the server skips what
// follows in the batch, the COMMIT included.
func runTx[R any](ctx context.Context, store *idem.Store[R], b *Backend, c claimedTx, claim backend.Record, fn func(context.Context, pgx.Tx) (R, error)) (val R, err error) {
	opts := txrun.Of(store).Options()
	sp, err := c.conn.Conn().BeginTx(ctx, pgx.TxOptions{BeginQuery: `savepoint ` + savepoint})
	if err != nil {
		return val, &idem.BackendError{Op: "claim", Err: err}
	}
	ftx := &fnTx{Tx: sp}
	// A panic in fn goes up to Ticket.Do, which reports it; the deferred
	// rollback takes the key and fn's writes away, as for an error.
	val, err = fn(context.WithValue(ctx, inTx{}, b.pool), ftx)
	if err != nil && !idem.IsFinal(err) {
		return val, err
	}
	if ftx.closed { // fn committed or rolled back its transaction itself
		return val, txrun.Unrecorded(err, pgx.ErrTxClosed)
	}
	done := claim
	if eerr := txrun.Of(store).Encode(&done, val, err); eerr != nil {
		return val, txrun.Unrecorded(err, eerr)
	}
	end := `release savepoint ` + savepoint
	if err != nil { // final: keep the key and the error, not fn's writes
		end = `rollback to savepoint ` + savepoint
	}
	batch := &pgx.Batch{}
	batch.Queue(end)
	batch.Queue(completeChecked(b), done.Key, done.Token, micros(opts.TTL), done.Value, done.Failed, backend.StorableText(done.ErrMsg))
	batch.Queue(`commit`)
	cerr := c.conn.SendBatch(ctx, batch).Close()
	switch {
	case cerr == nil:
		return val, err
	case refused(cerr):
		return val, txrun.Unrecorded(err, explainedTx(cerr))
	case pgconn.SafeToRetry(cerr): // nothing was sent: no COMMIT to ask about
		return val, txrun.Unrecorded(err, unsent(cerr))
	case !committed(ctx, b, opts, c.xid, done):
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
			return err == nil && ok && rec.CompletedBy(done.Token)
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
