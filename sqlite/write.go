package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
)

// prepared returns query prepared on b's database, preparing it on first
// use: the driver parses SQL in transpiled C, and a replay's one SELECT
// costs several times more parsed afresh than prepared. New prepares every
// statement, so none is first prepared inside a transaction.
func (b *Backend) prepared(ctx context.Context, query string) (*sql.Stmt, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if st, ok := b.stmts[query]; ok {
		return st, nil
	}
	st, err := b.db.PrepareContext(ctx, query)
	if err != nil {
		return nil, closedErr(err)
	}
	b.stmts[query] = st
	return st, nil
}

// query runs a prepared query, in tx if it is not nil.
func (b *Backend) query(ctx context.Context, tx *sql.Tx, query string, args ...any) (*sql.Rows, error) {
	if tx == nil && ctx.Value(inTx{}) == b && b.db.Stats().MaxOpenConnections == 1 {
		// A read with fn's ctx on a pool of one would wait for the
		// connection fn's transaction holds, for ever: fn's ctx does not
		// end with its caller's. (On a larger pool, reads go on beside
		// fn's transaction, as WAL allows.)
		return nil, backend.Refuse(errNested)
	}
	st, err := b.prepared(ctx, query)
	if err != nil {
		return nil, err
	}
	if tx != nil {
		st = tx.StmtContext(ctx, st)
	}
	return st.QueryContext(ctx, args...)
}

// execIn runs a prepared writing statement in tx and returns how many rows
// it changed.
func (b *Backend) execIn(ctx context.Context, tx *sql.Tx, query string, args ...any) (int64, error) {
	st, err := b.prepared(ctx, query)
	if err != nil {
		return 0, closedErr(err)
	}
	res, err := tx.StmtContext(ctx, st).ExecContext(ctx, args...)
	if err != nil {
		return 0, closedErr(err)
	}
	n, err := res.RowsAffected()
	return n, closedErr(err)
}

// errNested is returned by a Backend's writes called, with fn's ctx, from
// inside RunOnceTx's fn: they would wait for the write lock that fn's own
// transaction holds; and by its reads so called on a pool of one
// connection (SetMaxOpenConns(1)), which would wait for the connection fn's
// transaction holds.
var errNested = errors.New("sqlite: called from inside RunOnceTx's fn, whose transaction holds the write lock: use its *sql.Tx")

// inTx is the context key that marks the context of an fn running in a
// transaction of the Backend it holds.
type inTx struct{}

// lock takes the write semaphore, or gives up when ctx ends.
func (b *Backend) lock(ctx context.Context) error {
	if ctx.Value(inTx{}) == b {
		return backend.Refuse(errNested)
	}
	select {
	case b.write <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (b *Backend) unlock() { <-b.write }

// exec runs one writing statement in the next shared transaction, and
// returns how many rows it changed once that has committed.
func (b *Backend) exec(ctx context.Context, query string, args ...any) (int64, error) {
	var n int64
	err := b.do(ctx, func(ctx context.Context, tx *sql.Tx) (err error) {
		n, err = b.execIn(ctx, tx, query, args...)
		return err
	})
	return n, err
}

// inTx runs fn in a transaction of its own, in the process's write turn,
// and commits it if fn returns nil. fn's first statement should write, so that the
// transaction takes the write lock at once, whatever the driver's BEGIN.
func (b *Backend) inTx(ctx context.Context, fn func(*sql.Tx) error) error {
	if err := b.lock(ctx); err != nil {
		return err
	}
	defer b.unlock()
	return closedErr(whileBusy(ctx, func() error {
		tx, err := b.db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback() // a no-op once committed
		if err := fn(tx); err != nil {
			return err
		}
		return tx.Commit()
	}))
}

// whileBusy runs try again, with a backoff, for as long as it fails with
// SQLITE_BUSY (another process held the write lock for longer than the
// busy timeout, or a connection has none) and ctx lasts: a write that
// found the database locked did nothing, so it is safe to repeat.
func whileBusy(ctx context.Context, try func() error) error {
	for wait := time.Millisecond; ; wait = min(2*wait, 100*time.Millisecond) {
		err := try()
		if err == nil || !busy(err) {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (%w)", err, ctx.Err())
		case <-time.After(wait):
		}
	}
}

// busy reports whether err is SQLite's "database is locked", whatever the
// driver.
func busy(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "database is locked") || strings.Contains(msg, "SQLITE_BUSY")
}

// closedErr makes database/sql's "database is closed", which it exports no
// sentinel for, match idem.ErrClosed.
func closedErr(err error) error {
	if err != nil && strings.Contains(err.Error(), "sql: database is closed") {
		return fmt.Errorf("%w: %w", idem.ErrClosed, err)
	}
	return err
}
