package mysql

import (
	"context"
	"database/sql"
	"net"
	"sync"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/seed094d4201/idem"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// roundTripsNewKey is how many round trips a new key in RunOnceTx costs,
// the caller's own transaction (START TRANSACTION, its write, COMMIT)
// included, on a DSN with interpolateParams (every statement one round
// trip). database/sql sends each statement on its own, and *sql.Tx's
// BEGIN and COMMIT alone, so what it adds is a statement each: the
// session's settings (autocommit off, the server's clock) and their
// undoing, read committed (database/sql's SET TRANSACTION before the
// BEGIN), the claim, the savepoint fn runs in and its release, and the
// outcome. (11 while the session's return to the pool began with a
// ROLLBACK after the COMMIT.)
const roundTripsNewKey = 10

// The round trips of a new key in RunOnceTx, counted on the wire (a round
// trip is the client writing after it has read, or for the first time),
// against the caller's own transaction.
func TestRunOnceTxNewKeyRoundTrips(t *testing.T) {
	cfg, err := mysql.ParseDSN(testDSN(t))
	require.NoError(t, err)
	cfg.InterpolateParams = true
	var trips turns
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &turnConn{Conn: c, turns: &trips}, nil
	}
	connector, err := mysql.NewConnector(cfg)
	require.NoError(t, err)
	db := sql.OpenDB(connector)
	t.Cleanup(func() { db.Close() })
	db.SetMaxOpenConns(1) // one connection, warmed by the first calls
	b, table := testBackend(t, db)
	name := moves(t, db, table)
	s := idem.New[int](idem.Options{Backend: b, SweepInterval: -1})
	t.Cleanup(func() { s.Close() })
	ctx := context.Background()

	write := func(ctx context.Context, tx *sql.Tx) (int, error) {
		res, err := tx.ExecContext(ctx, "INSERT INTO "+name+" (note) VALUES ('x')")
		if err != nil {
			return 0, err
		}
		id, err := res.LastInsertId()
		return int(id), err
	}
	bare := func() {
		tx, err := db.BeginTx(ctx, nil)
		require.NoError(t, err)
		defer tx.Rollback()
		_, err = write(ctx, tx)
		require.NoError(t, err)
		require.NoError(t, tx.Commit())
	}
	guarded := func(key string) func() {
		return func() {
			_, err := RunOnceTx(ctx, s, key, "p", write)
			require.NoError(t, err)
		}
	}
	bare()
	guarded("warm")()

	own := trips.during(bare)
	require.Equal(t, 3, own, "the caller's own transaction: START TRANSACTION, the insert, COMMIT")
	n := trips.during(guarded("new"))
	t.Logf("a new key: %d round trips; the caller's own transaction: %d", n, own)
	assert.LessOrEqual(t, n, roundTripsNewKey)
	assert.Equal(t, 4, count(t, db, "SELECT count(*) FROM "+name), "two bare writes, and one for each key")
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
