package postgres

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A querier sends statements: the pool, or one of its connections.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// onConn runs f, which sends statements on q under qctx, and ends them when
// ctx ends. pgx ends a statement under a ctx that can end by watching it
// from a goroutine it starts and stops for every statement, which made a
// new key's two statements cost about a quarter more CPU (bench:
// raw-postgres-reqctx against raw-postgres). On a pool whose connections
// handle a cancellation as pgx does by default
// (pgconn.DeadlineContextWatcherHandler: the socket's deadline is set to
// now, and cleared once the statement is over), onConn does the same
// through context.AfterFunc, which starts no goroutine unless ctx ends:
// f gets a connection of its own and ctx without its cancellation, which
// pgx does not watch. Any other pool, and a ctx that cannot end, send on
// the pool under ctx.
//
// A statement cut short so fails with an error that matches ctx's, as
// pgx's own watching makes it (its connection is closed by pgx, as
// there); one that was answered before the deadline took hold keeps its
// answer, and its connection, whose deadline is cleared, goes back to the
// pool.
func (b *Backend) onConn(ctx context.Context, f func(qctx context.Context, q querier) error) (err error) {
	if ctx.Done() == nil || !b.deadlines {
		return f(ctx, b.pool)
	}
	c, err := b.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer c.Release()
	w := &watch{pc: c.Conn().PgConn(), quiet: quiet{ctx}}
	w.cutting.Add(1)
	stop := context.AfterFunc(ctx, w.cut)
	// Deferred, before the Release: were f's goroutine ended by code of
	// the pool's (a tracer's panic, runtime.Goexit), a watch left behind
	// would cut the connection, back in the pool, under another caller's
	// statement once ctx ended.
	defer w.end(ctx, stop, &err)
	err = f(&w.quiet, c)
	if hook := testHookStatementAnswered.Load(); hook != nil {
		(*hook)()
	}
	return err
}

// end ends w's watch of ctx, whose statement's error is *err.
func (w *watch) end(ctx context.Context, stop func() bool, err *error) {
	if stop() {
		return // ctx did not end: no deadline was set, nor will be
	}
	// ctx ended: the cut runs, or ran. Once it has, the deadline is
	// cleared, as pgx clears its own, so that the connection, if the
	// statement was answered before the deadline took hold, goes back to
	// the pool sound. One cut mid-statement pgx has closed, and is closing
	// in the background under a deadline of its own, left alone.
	w.cutting.Wait()
	if !w.pc.IsClosed() {
		_ = w.pc.Conn().SetDeadline(time.Time{})
	}
	if *err != nil {
		*err = &ctxEnded{ctx: ctx.Err(), err: *err}
	}
}

// testHookStatementAnswered, if set, runs once a statement sent by onConn
// has been answered, before its watch ends. Atomic: a store an earlier
// test left running may send statements while a test sets it.
var testHookStatementAnswered atomic.Pointer[func()]

// A watch ends a connection's statement when its ctx ends.
type watch struct {
	pc      *pgconn.PgConn
	quiet   quiet          // the statement's ctx, in the same allocation
	cutting sync.WaitGroup // done once cut has run
}

// cut sets the connection's deadline to now: its read or write fails.
func (w *watch) cut() {
	defer w.cutting.Done()
	_ = w.pc.Conn().SetDeadline(time.Now())
}

// A quiet context is its parent without its cancellation, as
// context.WithoutCancel makes one: pgx does not watch it.
type quiet struct{ parent context.Context }

func (*quiet) Deadline() (time.Time, bool) { return time.Time{}, false }
func (*quiet) Done() <-chan struct{}       { return nil }
func (*quiet) Err() error                  { return nil }
func (q *quiet) Value(key any) any         { return q.parent.Value(key) }

// ctxEnded is a statement's error when its ctx ended while it was sent: it
// matches both ctx's error and the connection's.
type ctxEnded struct{ ctx, err error }

func (e *ctxEnded) Error() string   { return "timeout: " + e.ctx.Error() + ": " + e.err.Error() }
func (e *ctxEnded) Unwrap() []error { return []error{e.ctx, e.err} }

// deadlineHandled reports whether cfg's connections handle a cancelled
// ctx as pgx does by default: a deadline of now on the socket
// (pgconn.DeadlineContextWatcherHandler, with no delay). A custom builder
// is asked once, for a connection not yet made; one that fails so keeps
// pgx's own watching.
func deadlineHandled(cfg *pgx.ConnConfig) (ok bool) {
	if cfg == nil || cfg.BuildContextWatcherHandler == nil {
		return false
	}
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	h, ok := cfg.BuildContextWatcherHandler(&pgconn.PgConn{}).(*pgconn.DeadlineContextWatcherHandler)
	return ok && h.DeadlineDelay == 0
}

var _ querier = (*pgxpool.Pool)(nil)
var _ querier = (*pgxpool.Conn)(nil)
