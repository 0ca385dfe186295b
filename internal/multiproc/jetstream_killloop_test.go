package multiproc

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemqueue"
	"github.com/seed094d4201/idem/idemqueue/idemnats"
	"github.com/seed094d4201/idem/internal/svctest"
	"github.com/seed094d4201/idem/sqlite"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The JetStream kill loop: the queue kill loop (queue_killloop_test.go)
// with idemnats's TxConsumer, eight workers handling the messages of one
// durable consumer, each message's effect a row written in the
// transaction that commits its key. A child is SIGKILLed at random
// moments, again and again; what it left unacked is redelivered after
// AckWait. However the kills fall, every message has its effect exactly
// once.
const (
	jsKillEnv     = "IDEM_MULTIPROC_JS_KILL" // the stream the child consumes
	jsKillDBEnv   = "IDEM_MULTIPROC_JS_DB"   // its sqlite file
	jsKillURLEnv  = "IDEM_MULTIPROC_JS_URL"  // the server's URL
	jsKillWorkers = 8
)

func TestJetStreamKillLoop(t *testing.T) {
	url := svctest.NATS(t)
	kills := 6
	if svctest.Long() && !testing.Short() {
		kills = 25
	}
	nc, err := nats.Connect(url)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx := context.Background()
	name := strings.ToUpper(uniqueName("IDEMKILL_"))
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), name) })
	cons, err := js.CreateOrUpdateConsumer(ctx, name, jetstream.ConsumerConfig{
		Durable: "worker", AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Second, MaxAckPending: 64,
	})
	require.NoError(t, err)
	// Enough messages that every child dies with work left.
	messages := 300 * kills
	for i := range messages {
		_, err := js.Publish(ctx, name, []byte(fmt.Sprintf("body %d", i)), jetstream.WithMsgID(fmt.Sprintf("m%05d", i)))
		require.NoError(t, err)
	}
	db := filepath.Join(t.TempDir(), "effects.db")
	env := []string{jsKillEnv + "=" + name, jsKillDBEnv + "=" + db, jsKillURLEnv + "=" + url}
	for range kills {
		c := startChild(t, env...)
		// A random delay picks the moment of the crash; it orders nothing.
		time.Sleep(100*time.Millisecond + rand.N(600*time.Millisecond))
		killHard(t, c)
	}

	// The last child works until every message has had its effect and
	// the consumer has nothing pending.
	last := startChild(t, env...)
	defer killHard(t, last)
	effects, err := sqlite.Open(db)
	require.NoError(t, err)
	defer effects.Close()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var ids, rows int
		require.NoError(t, effects.QueryRow(`SELECT count(DISTINCT id), count(*) FROM effects`).Scan(&ids, &rows))
		info, err := cons.Info(ctx)
		require.NoError(t, err)
		if ids == messages && info.NumPending == 0 && info.NumAckPending == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 2 minutes: %d of %d messages had their effect (%d rows); %d pending, %d awaiting an ack", ids, messages, rows, info.NumPending, info.NumAckPending)
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

// runJetStreamKillChild consumes the stream until it is killed. It
// returns only on an error it cannot carry on from.
func runJetStreamKillChild() error {
	ctx := context.Background()
	db, err := sqlite.Open(os.Getenv(jsKillDBEnv))
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
	c, err := idemnats.NewTx(store, sqlite.RunOnceTx[int64], idemnats.Options{
		Consumer: idemqueue.Options{RetryDelay: 20 * time.Millisecond, BusyWait: 100 * time.Millisecond},
	})
	if err != nil {
		return err
	}
	nc, err := nats.Connect(os.Getenv(jsKillURLEnv))
	if err != nil {
		return err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	cons, err := js.Consumer(ctx, os.Getenv(jsKillEnv), "worker")
	if err != nil {
		return err
	}
	msgs, err := cons.Messages()
	if err != nil {
		return err
	}
	fmt.Println("ready")
	handle := func(ctx context.Context, tx *sql.Tx, msg jetstream.Msg) (int64, error) {
		res, err := tx.ExecContext(ctx, `INSERT INTO effects (id, pid) VALUES (?, ?)`, msg.Headers().Get(jetstream.MsgIDHeader), os.Getpid())
		if err != nil {
			return 0, err
		}
		if rand.N(4) == 0 {
			return 0, errors.New("a transient failure: rolled back, retried later")
		}
		return res.LastInsertId()
	}
	failed := make(chan error, jsKillWorkers)
	for range jsKillWorkers {
		go func() {
			for {
				msg, err := msgs.Next()
				if err != nil {
					failed <- err
					return
				}
				_, _ = c.Handle(ctx, msg, handle)
			}
		}()
	}
	return fmt.Errorf("a worker stopped: %w", <-failed)
}
