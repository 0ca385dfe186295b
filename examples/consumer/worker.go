package main

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemqueue"
	"github.com/seed094d4201/idem/idemqueue/idemnats"
	"github.com/seed094d4201/idem/idemqueue/idemrabbit"
	"github.com/seed094d4201/idem/sqlite"
)

// The worker is this program started again with these set. It consumes
// the broker's queue until it is killed, and says on stdout "ready", then
// "ID ACTION" for each delivery it settled.
const (
	brokerEnv  = "IDEM_CONSUMER_BROKER"  // "nats" or "rabbitmq"
	urlEnv     = "IDEM_CONSUMER_URL"     // the broker's address
	queueEnv   = "IDEM_CONSUMER_QUEUE"   // the stream (NATS) or queue (RabbitMQ)
	dbEnv      = "IDEM_CONSUMER_DB"      // the SQLite file: keys and stock
	serviceEnv = "IDEM_CONSUMER_SERVICE" // set: the effect is a charge at this payments service
	crashEnv   = "IDEM_CONSUMER_CRASH"   // an event ID: stop inside its transaction, say "inside ID", wait to be killed
)

// A worker is one consumer process: its store, its stock, its broker.
type worker struct {
	store   *idem.Store[int]
	db      *sql.DB
	crash   string
	service *payments
	out     io.Writer
}

func serveWorker(broker string, out io.Writer) error {
	db, err := sqlite.Open(os.Getenv(dbEnv))
	if err != nil {
		return err
	}
	defer db.Close()
	b, err := sqlite.New(context.Background(), db, sqlite.Options{})
	if err != nil {
		return err
	}
	if _, err := db.Exec(`CREATE TABLE IF NOT EXISTS stock (item TEXT PRIMARY KEY, count INTEGER NOT NULL)`); err != nil {
		return err
	}
	// A short lease: the claims a killed worker held lapse soon, and its
	// successor meets them interrupted.
	w := &worker{store: idem.New[int](idem.Options{Backend: b, TTL: 7 * 24 * time.Hour, Lease: 300 * time.Millisecond}),
		db: db, crash: os.Getenv(crashEnv), out: out}
	defer w.store.Close()
	opts := idemqueue.Options{RetryDelay: 100 * time.Millisecond, BusyDelay: 100 * time.Millisecond, InterruptedDelay: 100 * time.Millisecond, BusyWait: time.Second}
	if url := os.Getenv(serviceEnv); url != "" {
		w.service = &payments{url: url}
		opts.Reconcile = w.reconcile
	}
	q, err := idemqueue.New(w.store, opts)
	if err != nil {
		return err
	}
	switch broker {
	case "nats":
		return w.consumeNATS(q)
	case "rabbitmq":
		return w.consumeRabbitMQ(q)
	}
	return fmt.Errorf("unknown broker %q (nats or rabbitmq)", broker)
}

// consumeNATS is the idem glue for JetStream: the rest is NATS's own.
func (w *worker) consumeNATS(q *idemqueue.Consumer[int]) error {
	nc, err := nats.Connect(os.Getenv(urlEnv))
	if err != nil {
		return err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	cons, err := js.Consumer(context.Background(), os.Getenv(queueEnv), "worker")
	if err != nil {
		return err
	}
	c, err := idemnats.New(q, idemnats.Options{ProgressInterval: time.Second})
	if err != nil {
		return err
	}
	_, err = cons.Consume(func(m jetstream.Msg) {
		var d idemqueue.Decision
		if w.service != nil {
			d, _ = c.Handle(context.Background(), m, func(ctx context.Context, m jetstream.Msg) (int, error) {
				return w.charge(ctx, m.Headers().Get(jetstream.MsgIDHeader), m.Data())
			})
		} else {
			d, _ = c.HandleTx(context.Background(), m, w.apply)
		}
		w.said(m.Headers().Get(jetstream.MsgIDHeader), d)
	})
	if err != nil {
		return err
	}
	fmt.Fprintln(w.out, "ready")
	select {} // until killed
}

// consumeRabbitMQ is the idem glue for RabbitMQ.
func (w *worker) consumeRabbitMQ(q *idemqueue.Consumer[int]) error {
	c, err := idemrabbit.New(q, idemrabbit.Options{Queue: os.Getenv(queueEnv), Declare: true, Prefetch: 8,
		Report: func(d amqp.Delivery, dec idemqueue.Decision, _ error) { w.said(d.MessageId, dec) }})
	if err != nil {
		return err
	}
	dial := func(context.Context) (*amqp.Connection, error) { return amqp.Dial(os.Getenv(urlEnv)) }
	fmt.Fprintln(w.out, "ready")
	if w.service != nil {
		return c.Run(context.Background(), dial, func(ctx context.Context, d amqp.Delivery) (int, error) { return w.charge(ctx, d.MessageId, d.Body) })
	}
	return c.RunTx(context.Background(), dial, w.apply)
}

func (w *worker) said(id string, d idemqueue.Decision) { fmt.Fprintln(w.out, id, d.Action) }

// apply applies an event's stock change once: key (the event's ID), the
// change and the stock left commit in one SQLite transaction.
func (w *worker) apply(ctx context.Context, key string, payload any) error {
	item, delta, err := parseBody(payload.([]byte))
	if err != nil {
		return idem.Final(err)
	}
	_, err = sqlite.RunOnceTx(ctx, w.store, key, payload, func(ctx context.Context, tx *sql.Tx) (int, error) {
		var left int
		err := tx.QueryRowContext(ctx, `INSERT INTO stock (item, count) VALUES (?1, ?2)
ON CONFLICT (item) DO UPDATE SET count = count + ?2 RETURNING count`, item, delta).Scan(&left)
		if err == nil && key == w.crash {
			fmt.Fprintln(w.out, "inside", key)
			select {} // until SIGKILL, inside the transaction
		}
		return left, err
	})
	return err
}

// charge makes an event's effect a remote one: a charge at the payments
// service, a step whose key the service recognises when it comes again.
func (w *worker) charge(ctx context.Context, key string, body []byte) (int, error) {
	_, amount, err := parseBody(body)
	if err != nil {
		return 0, idem.Final(err)
	}
	return idem.Step(ctx, "charge", func(ctx context.Context) (int, error) {
		return w.service.charge(ctx, idem.StepKey(ctx), key, amount)
	})
}

// reconcile settles an interrupted event, whose worker died in its
// handler: the payments service says whether the charge happened.
func (w *worker) reconcile(ctx context.Context, key string, err error) idemqueue.Decision {
	id, done, lerr := w.service.lookup(ctx, key)
	switch {
	case lerr != nil:
		return idemqueue.Decision{Action: idemqueue.Retry, Delay: 100 * time.Millisecond, Err: lerr}
	case done:
		lerr = w.store.Resolve(ctx, key, id, nil)
	default:
		lerr = w.store.Forget(ctx, key)
	}
	if lerr != nil {
		return idemqueue.Decision{Action: idemqueue.Retry, Delay: 100 * time.Millisecond, Err: lerr}
	}
	fmt.Fprintln(w.out, key, "reconciled", done)
	return idemqueue.Decision{Action: idemqueue.Retry} // at once: replayed, or run afresh
}

// parseBody reads an event's body, "ITEM DELTA".
func parseBody(body []byte) (string, int, error) {
	item, d, ok := strings.Cut(string(body), " ")
	delta, err := strconv.Atoi(d)
	if !ok || err != nil {
		return "", 0, fmt.Errorf("event body %q: want ITEM DELTA", body)
	}
	return item, delta, nil
}
