package postgres

import (
	"context"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/seed094d4201/idem/backend"
	"github.com/stretchr/testify/require"
)

// endingTracer ends the goroutine of the next statement it sees, by a
// panic or runtime.Goexit, once armed: a user's tracer that misbehaves.
type endingTracer struct{ armed atomic.Pointer[func()] }

func (e *endingTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	if end := e.armed.Swap(nil); end != nil {
		(*end)()
	}
	return ctx
}

func (e *endingTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// A statement whose goroutine the pool's own code ends (a tracer's panic,
// runtime.Goexit) leaves no watch of its ctx behind: the ctx ending later
// does not cut the connection, back in the pool, under another caller's
// statement.
func TestStatementEndedByAPanicLeavesNoWatchOnItsConnection(t *testing.T) {
	for name, end := range map[string]func(){
		"panic":  func() { panic("tracer") },
		"Goexit": runtime.Goexit,
	} {
		t.Run(name, func(t *testing.T) {
			tr := &endingTracer{}
			pool := poolWith(t, func(cfg *pgxpool.Config) {
				cfg.MaxConns = 1
				cfg.ConnConfig.Tracer = tr
			})
			b, _ := testBackend(t, pool)
			require.True(t, b.deadlines)
			bg := context.Background()
			_, _, err := b.Claim(bg, backend.Record{Key: "k", Token: "t", State: backend.StatePending}, time.Time{}, time.Minute)
			require.NoError(t, err)

			ctx, cancel := context.WithCancel(bg)
			defer cancel()
			tr.armed.Store(&end)
			done := make(chan struct{})
			go func() {
				defer close(done)
				defer func() { _ = recover() }()
				_, _, _ = b.Get(ctx, "k", time.Time{})
			}()
			<-done
			cancel() // the caller's request is over
			// Were the ctx still watched, its cut would land on the pool's
			// one connection, now another's, within these statements.
			for i := range 200 {
				_, found, err := b.Get(bg, "k", time.Time{})
				require.NoError(t, err, "statement %d: the connection was cut by an earlier caller's ctx", i)
				require.True(t, found)
			}
		})
	}
}
