package idemnats

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/bolt"
	"github.com/seed094d4201/idem/idemqueue"
	"github.com/seed094d4201/idem/sqlite"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A JetStream worker on sqlite is three calls (sqlite.Open, sqlite.New,
// idem.New) and NewTx, and its handler is typed: the message as
// JetStream gives it, the backend's own transaction. Its writes commit
// once; a redelivery is acked as a replay.
func TestTxConsumerIsTypedAndShort(t *testing.T) {
	db, err := sqlite.Open(filepath.Join(t.TempDir(), "jobs.db"))
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	_, err = db.Exec(`CREATE TABLE jobs (body BLOB)`)
	require.NoError(t, err)
	b, err := sqlite.New(context.Background(), db, sqlite.Options{})
	require.NoError(t, err)
	store := idem.New[int64](idem.Options{Backend: b})
	t.Cleanup(func() { store.Close() })

	c, err := NewTx(store, sqlite.RunOnceTx[int64], Options{})
	require.NoError(t, err)
	insert := func(ctx context.Context, tx *sql.Tx, msg jetstream.Msg) (int64, error) {
		res, err := tx.ExecContext(ctx, `INSERT INTO jobs (body) VALUES (?)`, msg.Data())
		if err != nil {
			return 0, err
		}
		return res.LastInsertId()
	}
	first, again := newMsg("msg-1", "job 1"), newMsg("msg-1", "job 1")
	d, err := c.Handle(context.Background(), first, insert)
	require.NoError(t, err)
	assert.Equal(t, idemqueue.Decision{Action: idemqueue.Ack}, d)
	var got []idemqueue.Decision
	c.MessageHandler(context.Background(), insert, func(_ jetstream.Msg, d idemqueue.Decision, err error) {
		assert.NoError(t, err)
		got = append(got, d)
	})(again)
	assert.Equal(t, []idemqueue.Decision{{Action: idemqueue.Ack, Replayed: true}}, got)
	settles, _ := again.got()
	assert.Equal(t, []string{"ack"}, settles)
	var rows int
	require.NoError(t, db.QueryRow(`SELECT count(*) FROM jobs`).Scan(&rows))
	assert.Equal(t, 1, rows)
}

// A store on another backend than the RunOnceTx's is refused by NewTx.
func TestNewTxRefusesAStoreOnAnotherBackend(t *testing.T) {
	b, err := bolt.Open(filepath.Join(t.TempDir(), "keys.db"), nil)
	require.NoError(t, err)
	t.Cleanup(func() { b.Close() })
	store := idem.New[int64](idem.Options{Backend: b})
	t.Cleanup(func() { store.Close() })
	_, err = NewTx(store, sqlite.RunOnceTx[int64], Options{})
	assert.ErrorContains(t, err, "*sqlite.Backend")
}
