// Command consumer tells the story of a stock worker fed by a real broker,
// NATS JetStream or RabbitMQ, that delivers each event at least once: the
// publisher sends one event twice, and the worker is killed in the middle
// of another and started again. Each event's idempotency key is its
// message ID, and idemqueue's adapter runs the stock change through
// sqlite.RunOnceTx, so the key, the change and the answer commit in one
// transaction: the stock ends as if each event were applied once.
//
//	go run ./examples/consumer -broker nats
//	go run ./examples/consumer -broker rabbitmq
//
// It uses the broker at IDEM_NATS_URL (default nats://127.0.0.1:4222) or
// IDEM_AMQP_URL (default amqp://guest:guest@127.0.0.1:5672/), in a stream
// or queue of its own that it deletes at the end.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/sqlite"
)

func main() {
	if kind := os.Getenv(brokerEnv); kind != "" {
		if err := serveWorker(kind, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "worker:", err)
			os.Exit(1)
		}
		return
	}
	kind := flag.String("broker", "nats", "the broker: nats or rabbitmq")
	flag.Parse()
	exe, err := os.Executable()
	if err == nil {
		err = run(os.Stdout, exe, *kind)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "consumer:", err)
		os.Exit(1)
	}
}

// The events: order 101 is published twice; the worker is killed inside
// order 102's transaction.
var events = []struct{ id, body string }{
	{"order-101-placed", "dosa-mix -2"},
	{"order-101-placed", "dosa-mix -2"},
	{"order-102-placed", "idli-rava -3"},
	{"order-103-placed", "dosa-mix -1"},
}

func run(w io.Writer, exe, kind string) error {
	b, err := openBroker(kind)
	if err != nil {
		return err
	}
	defer b.close()
	dir, err := os.MkdirTemp("", "consumer")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	db := filepath.Join(dir, "stock.db")
	if err := seedStock(db); err != nil {
		return err
	}
	fmt.Fprintf(w, "%s: 4 events published, order-101-placed twice; stock 10 dosa-mix, 10 idli-rava\n", kind)
	for _, e := range events {
		if err := b.publish(e.id, []byte(e.body)); err != nil {
			return err
		}
	}
	t := newTally()
	p, err := startWorker(exe, kind, b, db, t, crashEnv+"=order-102-placed")
	if err != nil {
		return err
	}
	_, err = p.waitFor(func(l string) bool { return l == "inside order-102-placed" }, 30*time.Second)
	p.kill()
	if err != nil {
		return err
	}
	fmt.Fprintln(w, "  the worker is killed inside order-102-placed's transaction (SIGKILL), before its ack")
	if p, err = startWorker(exe, kind, b, db, t); err != nil {
		return err
	}
	defer p.kill()
	fmt.Fprintln(w, "  a new worker starts; the broker hands out what was not acked again")
	if err := drain(b, db, []string{"order-101-placed", "order-102-placed", "order-103-placed"}, 30*time.Second); err != nil {
		return err
	}
	p.kill()
	dosa, idli, err := readStock(db)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "  final stock: %d dosa-mix, %d idli-rava (10-2-1 and 10-3): each event applied once\n", dosa, idli)
	return nil
}

// drain waits until the workers' store holds an outcome for each of ids
// and the broker holds nothing more. (Not what the workers said: a worker
// killed between its ack and its word leaves an event acked, unsaid.)
func drain(b broker, db string, ids []string, timeout time.Duration) error {
	dbh, err := sqlite.Open(db)
	if err != nil {
		return err
	}
	defer dbh.Close()
	keys, err := sqlite.New(context.Background(), dbh, sqlite.Options{NoMigrate: true})
	if err != nil {
		return err
	}
	deadline := time.Now().Add(timeout)
	left := slices.Clone(ids)
	for {
		for len(left) > 0 {
			rec, ok, err := keys.Get(context.Background(), left[0], time.Now())
			if err != nil {
				return err
			}
			if !ok || rec.State != backend.StateCompleted {
				break
			}
			left = left[1:]
		}
		if len(left) == 0 {
			done, err := b.settled()
			if err != nil || done {
				return err
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not drained in %v: %d events without an outcome, the first %v", timeout, len(left), left[:min(len(left), 5)])
		}
		time.Sleep(50 * time.Millisecond) // the broker's and the workers' work
	}
}

func seedStock(path string) error {
	db, err := sqlite.Open(path)
	if err != nil {
		return err
	}
	defer db.Close()
	_, err = db.Exec(`CREATE TABLE stock (item TEXT PRIMARY KEY, count INTEGER NOT NULL);
INSERT INTO stock VALUES ('dosa-mix', 10), ('idli-rava', 10)`)
	return err
}

func readStock(path string) (dosa, idli int, err error) {
	db, err := sqlite.Open(path)
	if err != nil {
		return 0, 0, err
	}
	defer db.Close()
	ctx := context.Background()
	if err = db.QueryRowContext(ctx, `SELECT count FROM stock WHERE item = 'dosa-mix'`).Scan(&dosa); err == nil {
		err = db.QueryRowContext(ctx, `SELECT count FROM stock WHERE item = 'idli-rava'`).Scan(&idli)
	}
	return dosa, idli, err
}
