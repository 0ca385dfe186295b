package postgres

import (
	"context"
	"net"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/internal/svctest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A new key in RunOnceTx costs the caller's own transaction (BEGIN, its
// write, COMMIT) one round trip more, and no other: the BEGIN goes with
// the claim, the COMMIT with the outcome, and the one more is the
// savepoint fn runs in. Counted on the wire: a round trip is the client
// writing after it has read (or for the first time).
func TestRunOnceTxNewKeyCostsOneRoundTripMore(t *testing.T) {
	testPool(t) // or skip
	cfg, err := pgxpool.ParseConfig(svctest.Postgres(t))
	require.NoError(t, err)
	cfg.MaxConns = 1 // one connection: its statements are prepared by the first calls
	cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	var trips turns
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &turnConn{Conn: c, turns: &trips}, nil
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	b, table := testBackend(t, pool)
	charges := table + "_charges"
	ctx := context.Background()
	_, err = pool.Exec(ctx, "CREATE TABLE "+charges+" (id serial PRIMARY KEY, ord int NOT NULL)")
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+charges) })
	s := idem.New[int](idem.Options{Backend: b, SweepInterval: -1})
	t.Cleanup(func() { s.Close() })

	insert := "INSERT INTO " + charges + " (ord) VALUES (101) RETURNING id"
	charge := func(ctx context.Context, tx pgx.Tx) (int, error) {
		var id int
		err := tx.QueryRow(ctx, insert).Scan(&id)
		return id, err
	}
	bare := func() {
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer tx.Rollback(ctx)
		_, err = charge(ctx, tx)
		require.NoError(t, err)
		require.NoError(t, tx.Commit(ctx))
	}
	guarded := func(key string) func() {
		return func() {
			_, err := RunOnceTx(ctx, s, key, "p", charge)
			require.NoError(t, err)
		}
	}
	bare()
	guarded("warm")() // the statements prepared, as on a connection in use

	own := trips.during(bare)
	require.Equal(t, 3, own, "the caller's own transaction: BEGIN, the insert, COMMIT")
	n := trips.during(guarded("new"))
	assert.LessOrEqual(t, n, own+1, "a new key in RunOnceTx: %d round trips, against %d for the caller's own transaction", n, own)
	t.Logf("a new key: %d round trips; the caller's own transaction: %d", n, own)
	assert.Equal(t, 4, count(t, pool, "SELECT count(*) FROM "+charges), "two bare charges, and one for each key")
	v, err := RunOnceTx(ctx, s, "new", "p", charge)
	require.NoError(t, err)
	assert.NotZero(t, v, "and its outcome replays")
}

// turns counts the round trips on its connections: each time a client
// writes after reading, it has waited for the server's answer.
type turns struct {
	mu    sync.Mutex
	n     int
	wrote bool // the last call on the wire was a write
}

func (t *turns) during(f func()) int {
	t.mu.Lock()
	before := t.n
	t.mu.Unlock()
	f()
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.n - before
}

type turnConn struct {
	net.Conn
	turns *turns
}

func (c *turnConn) Write(p []byte) (int, error) {
	c.turns.mu.Lock()
	if !c.turns.wrote {
		c.turns.n++
		c.turns.wrote = true
	}
	c.turns.mu.Unlock()
	return c.Conn.Write(p)
}

func (c *turnConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.turns.mu.Lock()
		c.turns.wrote = false
		c.turns.mu.Unlock()
	}
	return n, err
}
