package idemqueue_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemqueue"
	"github.com/seed094d4201/idem/sqlite"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A TxConsumer bounds the wait of a delivery whose id another delivery
// is handling by BusyWait, as Consumer.Handle does, and answers Retry
// after BusyDelay: the consumer's slot is not held for the whole of the
// other's handler (it was, whatever BusyWait said, until that handler's
// transaction ended). A delivery that runs its own handler is not cut
// short by BusyWait: it waits for its transaction, and is acked.
func TestTxConsumerBusyWaitBoundsTheWaitForAnotherDelivery(t *testing.T) {
	s, db := sqliteStore(t)
	const busyWait = 50 * time.Millisecond
	c, err := idemqueue.NewTx(s, sqlite.RunOnceTx[int64], idemqueue.Options{BusyWait: busyWait, BusyDelay: 7 * time.Second})
	require.NoError(t, err)
	entered, release := make(chan struct{}), make(chan struct{})
	first := make(chan idemqueue.Decision, 1)
	go func() {
		first <- c.Handle(context.Background(), "msg-1", "body", func(ctx context.Context, tx *sql.Tx) (int64, error) {
			close(entered)
			<-release // far longer than BusyWait
			_, err := tx.ExecContext(ctx, `INSERT INTO jobs (body) VALUES ('x')`)
			return 1, err
		})
	}()
	<-entered
	redelivered := make(chan idemqueue.Decision, 1)
	go func() {
		redelivered <- c.Handle(context.Background(), "msg-1", "body", func(context.Context, *sql.Tx) (int64, error) {
			t.Error("the redelivery's handler ran while the first ran")
			return 0, nil
		})
	}()
	select {
	case d := <-redelivered:
		assert.Equal(t, idemqueue.Retry, d.Action)
		assert.Equal(t, 7*time.Second, d.Delay, "BusyDelay")
		assert.ErrorIs(t, d.Err, idem.ErrInProgress)
	case <-time.After(100 * busyWait):
		t.Error("the redelivery waited past BusyWait for the first delivery's handler")
	}
	close(release)
	assert.Equal(t, idemqueue.Decision{Action: idemqueue.Ack}, <-first, "the first delivery waits for its own handler")
	if t.Failed() {
		<-redelivered
	}
	d := c.Handle(context.Background(), "msg-1", "body", func(context.Context, *sql.Tx) (int64, error) { return 0, nil })
	assert.Equal(t, idemqueue.Decision{Action: idemqueue.Ack, Replayed: true}, d)
	var rows int
	require.NoError(t, db.QueryRow(`SELECT count(*) FROM jobs`).Scan(&rows))
	assert.Equal(t, 1, rows)
}
