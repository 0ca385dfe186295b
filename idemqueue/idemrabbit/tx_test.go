package idemrabbit

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/bolt"
	"github.com/seed094d4201/idem/idemqueue"
	"github.com/seed094d4201/idem/sqlite"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A RabbitMQ worker on sqlite is three calls (sqlite.Open, sqlite.New,
// idem.New) and NewTx, and its handler is typed: the delivery as
// RabbitMQ gives it, the backend's own transaction. A message delivered
// twice commits its writes once; the second is acked as a replay.
func TestTxConsumerIsTypedAndShortOverRabbitMQ(t *testing.T) {
	br := newBroker(t)
	db, err := sqlite.Open(filepath.Join(t.TempDir(), "jobs.db"))
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	_, err = db.Exec(`CREATE TABLE jobs (body BLOB)`)
	require.NoError(t, err)
	b, err := sqlite.New(context.Background(), db, sqlite.Options{})
	require.NoError(t, err)
	store := idem.New[int64](idem.Options{Backend: b})
	t.Cleanup(func() { store.Close() })

	decided := make(chan idemqueue.Decision, 2)
	c, err := NewTx(store, sqlite.RunOnceTx[int64], Options{
		Queue:   br.queue,
		Declare: true,
		Report:  func(_ amqp.Delivery, d idemqueue.Decision, _ error) { decided <- d },
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- c.Run(ctx, br.dial, func(ctx context.Context, tx *sql.Tx, d amqp.Delivery) (int64, error) {
			res, err := tx.ExecContext(ctx, `INSERT INTO jobs (body) VALUES (?)`, d.Body)
			if err != nil {
				return 0, err
			}
			return res.LastInsertId()
		})
	}()
	t.Cleanup(func() { cancel(); <-done })
	br.declared(t)
	br.publish(t, "m1", "job 1")
	br.publish(t, "m1", "job 1") // a redelivery, as the publisher's retry makes one
	var got []idemqueue.Decision
	for range 2 {
		select {
		case d := <-decided:
			got = append(got, d)
		case <-time.After(20 * time.Second):
			t.Fatalf("decided %v, waiting for 2", got)
		}
	}
	// Run handles deliveries side by side: the two may be decided in
	// either order, the replay waiting in memory for the first.
	assert.ElementsMatch(t, []idemqueue.Decision{{Action: idemqueue.Ack}, {Action: idemqueue.Ack, Replayed: true}}, got)
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
	_, err = NewTx(store, sqlite.RunOnceTx[int64], Options{Queue: "q"})
	assert.ErrorContains(t, err, "*sqlite.Backend")
}
