package idemqueue_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/bolt"
	"github.com/seed094d4201/idem/idemqueue"
	"github.com/seed094d4201/idem/sqlite"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// sqliteStore returns a store on a sqlite file of the test's own, with a
// table for the handler's writes.
func sqliteStore(t *testing.T) (*idem.Store[int64], *sql.DB) {
	t.Helper()
	db, err := sqlite.Open(filepath.Join(t.TempDir(), "jobs.db"))
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	_, err = db.Exec(`CREATE TABLE jobs (body BLOB)`)
	require.NoError(t, err)
	b, err := sqlite.New(context.Background(), db, sqlite.Options{})
	require.NoError(t, err)
	s := idem.New[int64](idem.Options{Backend: b})
	t.Cleanup(func() { s.Close() })
	return s, db
}

// The common path of a consumer on a database is typed: the handler
// gets the backend's own transaction, with no call to write around
// RunOnceTx and no payload to assert back; its writes commit once, and a
// redelivery is a replay.
func TestTxConsumerHandlesTyped(t *testing.T) {
	s, db := sqliteStore(t)
	c, err := idemqueue.NewTx(s, sqlite.RunOnceTx[int64], idemqueue.Options{})
	require.NoError(t, err)
	body := []byte("job 1")
	insert := func(ctx context.Context, tx *sql.Tx) (int64, error) {
		res, err := tx.ExecContext(ctx, `INSERT INTO jobs (body) VALUES (?)`, body)
		if err != nil {
			return 0, err
		}
		return res.LastInsertId()
	}
	d := c.Handle(context.Background(), "msg-1", body, insert)
	assert.Equal(t, idemqueue.Decision{Action: idemqueue.Ack}, d)
	d = c.Handle(context.Background(), "msg-1", body, insert)
	assert.Equal(t, idemqueue.Decision{Action: idemqueue.Ack, Replayed: true}, d)
	var rows int
	require.NoError(t, db.QueryRow(`SELECT count(*) FROM jobs`).Scan(&rows))
	assert.Equal(t, 1, rows)
	assert.Same(t, s, c.Consumer().Store())
}

// A store on another backend than the RunOnceTx's is refused when the
// consumer is made, not at its first message.
func TestNewTxRefusesAStoreOnAnotherBackend(t *testing.T) {
	b, err := bolt.Open(filepath.Join(t.TempDir(), "keys.db"), nil)
	require.NoError(t, err)
	t.Cleanup(func() { b.Close() })
	onBolt := idem.New[int64](idem.Options{Backend: b})
	t.Cleanup(func() { onBolt.Close() })
	_, err = idemqueue.NewTx(onBolt, sqlite.RunOnceTx[int64], idemqueue.Options{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "*sqlite.Backend")

	inMemory := idem.New[int64](idem.Options{})
	t.Cleanup(func() { inMemory.Close() })
	_, err = idemqueue.NewTx(inMemory, bolt.RunOnceTx[int64], idemqueue.Options{})
	assert.Error(t, err)

	_, err = idemqueue.NewTx[int64, *sql.Tx](onBolt, nil, idemqueue.Options{})
	assert.Error(t, err)

	c, err := idemqueue.NewTx(onBolt, bolt.RunOnceTx[int64], idemqueue.Options{})
	require.NoError(t, err)
	assert.NotNil(t, c)
}
