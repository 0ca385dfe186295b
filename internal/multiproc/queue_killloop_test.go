package multiproc

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemqueue"
	"github.com/seed094d4201/idem/idemqueue/idemrabbit"
	"github.com/seed094d4201/idem/internal/svctest"
	"github.com/seed094d4201/idem/sqlite"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The queue kill loop: a child process consumes a RabbitMQ queue through
// idemrabbit's TxConsumer over sqlite, each message's effect a row written
// in the transaction that commits its key, and is SIGKILLed at a random
// moment, again and again: mid-handler, between its commit and its ack,
// between a retry's copy and the original's ack. One handling in four
// fails, so that copies wait in the retry queue when a child dies. The
// broker redelivers what a dead child left unacked. However the kills
// fall, every message has its effect exactly once.
const (
	queueKillEnv     = "IDEM_MULTIPROC_QUEUE_KILL" // the queue the child consumes
	queueKillDBEnv   = "IDEM_MULTIPROC_QUEUE_DB"   // its sqlite file
	queueKillAMQPEnv = "IDEM_MULTIPROC_QUEUE_AMQP" // the broker's URL
)

func TestQueueKillLoop(t *testing.T) {
	url := svctest.AMQP(t)
	kills := 6
	if svctest.Long() && !testing.Short() {
		kills = 25
	}
	conn, err := amqp.Dial(url)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	require.NoError(t, err)
	// Enough messages that every child dies with work left.
	messages := 300 * kills
	queue := uniqueName("idemkill.")
	_, err = ch.QueueDeclare(queue, true, false, false, false, nil)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = ch.QueueDelete(queue, false, false, false)
		_, _ = ch.QueueDelete(queue+".retry."+fmt.Sprint(queueKillRetry.Milliseconds()), false, false, false)
	})
	require.NoError(t, ch.Confirm(false))
	for i := range messages {
		conf, err := ch.PublishWithDeferredConfirm("", queue, false, false, amqp.Publishing{
			MessageId: fmt.Sprintf("m%04d", i), Body: []byte(fmt.Sprintf("body %d", i)), DeliveryMode: amqp.Persistent,
		})
		require.NoError(t, err)
		require.True(t, conf.Wait())
	}
	db := filepath.Join(t.TempDir(), "effects.db")
	env := []string{queueKillEnv + "=" + queue, queueKillDBEnv + "=" + db, queueKillAMQPEnv + "=" + url}
	for range kills {
		c := startChild(t, env...)
		// A random delay picks the moment of the crash; it orders nothing.
		time.Sleep(100*time.Millisecond + rand.N(600*time.Millisecond))
		killHard(t, c)
	}

	// The last child works until every message has had its effect and
	// the queues are empty.
	last := startChild(t, env...)
	defer killHard(t, last)
	effects, err := sqlite.Open(db)
	require.NoError(t, err)
	defer effects.Close()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var ids, rows int
		require.NoError(t, effects.QueryRow(`SELECT count(DISTINCT id), count(*) FROM effects`).Scan(&ids, &rows))
		q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		require.NoError(t, err)
		if ids == messages && q.Messages == 0 && q.Consumers == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 2 minutes: %d of %d messages had their effect (%d rows), %d left in the queue", ids, messages, rows, q.Messages)
		}
		time.Sleep(50 * time.Millisecond) // polls a process's progress; orders nothing
	}
	var children int
	require.NoError(t, effects.QueryRow(`SELECT count(DISTINCT pid) FROM effects`).Scan(&children))
	t.Logf("%d kills; %d of the %d children wrote effects", kills, children, kills+1)
	rows, err := effects.Query(`SELECT id, count(*) FROM effects GROUP BY id HAVING count(*) > 1`)
	require.NoError(t, err)
	defer rows.Close()
	for rows.Next() {
		var id string
		var n int
		require.NoError(t, rows.Scan(&id, &n))
		assert.Failf(t, "a message had its effect more than once", "%s: %d effects", id, n)
	}
	require.NoError(t, rows.Err())
}

// queueKillRetry is the children's RetryDelay: the handlings that fail
// wait that long in the retry queue.
const queueKillRetry = 20 * time.Millisecond

// runQueueKillChild consumes the queue until it is killed. It returns only
// on an error it cannot carry on from.
func runQueueKillChild() error {
	ctx := context.Background()
	db, err := sqlite.Open(os.Getenv(queueKillDBEnv))
	if err != nil {
		return err
	}
	if _, err := db.Exec(`CREATE TABLE IF NOT EXISTS effects (id TEXT NOT NULL, pid INTEGER NOT NULL)`); err != nil {
		return err
	}
	b, err := sqlite.New(ctx, db, sqlite.Options{})
	if err != nil {
		return err
	}
	store := idem.New[int64](idem.Options{Backend: b})
	c, err := idemrabbit.NewTx(store, sqlite.RunOnceTx[int64], idemrabbit.Options{
		Queue:    os.Getenv(queueKillEnv),
		Consumer: idemqueue.Options{RetryDelay: queueKillRetry, BusyWait: 100 * time.Millisecond},
	})
	if err != nil {
		return err
	}
	url := os.Getenv(queueKillAMQPEnv)
	fmt.Println("ready")
	err = c.Run(ctx, func(context.Context) (*amqp.Connection, error) { return amqp.Dial(url) },
		func(ctx context.Context, tx *sql.Tx, d amqp.Delivery) (int64, error) {
			res, err := tx.ExecContext(ctx, `INSERT INTO effects (id, pid) VALUES (?, ?)`, d.MessageId, os.Getpid())
			if err != nil {
				return 0, err
			}
			if rand.N(4) == 0 {
				return 0, errors.New("a transient failure: rolled back, retried later")
			}
			return res.LastInsertId()
		})
	return fmt.Errorf("Run returned: %w", err)
}
