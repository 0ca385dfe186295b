package postgres

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/internal/svctest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// doneTracer records, for every statement pgx sends, whether its ctx can
// end: pgx watches such a ctx from a goroutine of its own.
type doneTracer struct {
	mu        sync.Mutex
	watchable int // statements sent under a ctx that can end
	sent      int
}

func (d *doneTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.sent++
	if ctx.Done() != nil {
		d.watchable++
	}
	return ctx
}

func (d *doneTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func poolWith(t *testing.T, edit func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(svctest.Postgres(t))
	require.NoError(t, err)
	edit(cfg)
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// On a pool whose connections end a cancelled statement by a deadline on
// their socket (pgx's default), the backend sends its statements under a
// ctx pgx does not watch, and ends them itself when the caller's ctx ends:
// pgx would start and stop a goroutine for every statement.
func TestStatementsUnderACtxThatCanEndAreNotWatchedByPgx(t *testing.T) {
	tr := &doneTracer{}
	pool := poolWith(t, func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = tr })
	b, _ := testBackend(t, pool)
	require.True(t, b.deadlines)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tr.mu.Lock()
	tr.sent, tr.watchable = 0, 0
	tr.mu.Unlock()
	rec := backend.Record{Key: "k", Token: "t", State: backend.StatePending}
	_, won, err := b.Claim(ctx, rec, time.Time{}, time.Minute)
	require.NoError(t, err)
	require.True(t, won)
	rec.State = backend.StateCompleted
	require.NoError(t, b.Complete(ctx, rec, time.Time{}, time.Minute))
	_, found, err := b.Get(ctx, "k", time.Time{})
	require.NoError(t, err)
	require.True(t, found)
	tr.mu.Lock()
	defer tr.mu.Unlock()
	assert.Positive(t, tr.sent)
	assert.Zero(t, tr.watchable, "statements pgx watched from a goroutine")
}

// A pool whose connections handle a cancellation otherwise (a cancel
// request to the server, say) keeps pgx's own watching.
func TestAPoolWithAnotherCancellationKeepsPgxWatching(t *testing.T) {
	pool := poolWith(t, func(cfg *pgxpool.Config) {
		cfg.ConnConfig.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
			return &pgconn.CancelRequestContextWatcherHandler{Conn: c}
		}
	})
	b, _ := testBackend(t, pool)
	assert.False(t, b.deadlines)
}

// A statement waiting on a row another transaction holds ends when its
// ctx is cancelled, with an error matching the ctx's, and the pool goes on
// serving: the connection cut is not handed out again.
func TestStatementCutShortByItsCtxEndsAndThePoolGoesOn(t *testing.T) {
	pool := testPool(t)
	b, table := testBackend(t, pool)
	bg := context.Background()
	rec := backend.Record{Key: "held", Token: "t", State: backend.StatePending}
	_, _, err := b.Claim(bg, rec, time.Time{}, time.Minute)
	require.NoError(t, err)
	tx, err := pool.Begin(bg)
	require.NoError(t, err)
	defer tx.Rollback(bg)
	_, err = tx.Exec(bg, "SELECT 1 FROM "+table+" WHERE key = 'held' FOR UPDATE")
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(bg)
	ended := make(chan error, 1)
	go func() { ended <- b.Release(ctx, "held", "t") }()
	waitForLockWait(t, pool, table)
	start := time.Now()
	cancel()
	select {
	case err = <-ended:
	case <-time.After(10 * time.Second):
		t.Fatal("the statement did not end with its ctx")
	}
	assert.ErrorIs(t, err, context.Canceled)
	assert.Less(t, time.Since(start), 2*time.Second)
	require.NoError(t, tx.Rollback(bg))
	// The release cut short may yet land (the server ran it once the lock
	// was let go: a lost reply, which the Store settles by the token), so
	// only the pool's soundness is asked here.
	for range 2 * int(pool.Config().MaxConns) {
		_, _, err := b.Get(bg, "held", time.Time{})
		require.NoError(t, err)
	}
}

// waitForLockWait returns once a statement on table waits for a lock.
func waitForLockWait(t *testing.T, pool *pgxpool.Pool, table string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var waiting bool
		require.NoError(t, pool.QueryRow(context.Background(), `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
    WHERE wait_event_type = 'Lock' AND query LIKE '%'||$1||'%' AND query NOT LIKE '%pg_stat_activity%')`, table).Scan(&waiting))
		if waiting {
			return
		}
		require.True(t, time.Now().Before(deadline), "no statement waited for the lock")
		time.Sleep(5 * time.Millisecond) // the server's progress
	}
}

// Contexts ended at every moment around a statement (before it is sent,
// while it runs, just after it answered) leave no connection with a
// deadline behind: every later statement under a ctx that never ends
// succeeds, on every connection of the pool.
func TestCtxEndingAroundAStatementLeavesNoConnectionCut(t *testing.T) {
	pool := testPool(t)
	b, _ := testBackend(t, pool)
	bg := context.Background()
	for i := range 20 {
		rec := backend.Record{Key: fmt.Sprintf("k%d", i), Token: "t", State: backend.StatePending}
		_, _, err := b.Claim(bg, rec, time.Time{}, time.Minute)
		require.NoError(t, err)
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 1))
			for i := range 100 {
				ctx, cancel := context.WithCancel(bg)
				time.AfterFunc(time.Duration(r.IntN(400))*time.Microsecond, cancel)
				_, _, err := b.Get(ctx, fmt.Sprintf("k%d", i%20), time.Time{})
				if err != nil && !errors.Is(err, context.Canceled) {
					t.Errorf("a Get cut short by its ctx: %v", err)
				}
				cancel()
			}
		}()
	}
	wg.Wait()
	for i := range 4 * int(pool.Config().MaxConns) {
		_, found, err := b.Get(bg, fmt.Sprintf("k%d", i%20), time.Time{})
		require.NoError(t, err, "a connection left cut")
		require.True(t, found)
	}
}

// A ctx that ends after its statement was answered, before the watch
// ends, keeps the answer, and the deadline the watch set on the
// connection is cleared before the connection goes back to the pool.
func TestCtxEndingJustAfterTheAnswerLeavesTheConnectionSound(t *testing.T) {
	pool := poolWith(t, func(cfg *pgxpool.Config) { cfg.MaxConns = 1 })
	b, _ := testBackend(t, pool)
	bg := context.Background()
	_, _, err := b.Claim(bg, backend.Record{Key: "k", Token: "t", State: backend.StatePending}, time.Time{}, time.Minute)
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(bg)
	defer cancel()
	hook := func() { cancel() }
	testHookStatementAnswered.Store(&hook)
	_, found, err := b.Get(ctx, "k", time.Time{})
	testHookStatementAnswered.Store(nil)
	require.NoError(t, err, "answered before its ctx ended")
	require.True(t, found)
	for range 3 { // the pool's one connection
		_, found, err = b.Get(bg, "k", time.Time{})
		require.NoError(t, err, "the connection was handed out with its deadline set")
		require.True(t, found)
	}
}
