// Command worker tells the story of a queue worker that applies each stock
// change exactly once, though the broker delivers events at least once: the
// worker is killed in the middle of an event, restarts, and gets events it
// already applied again. Each event's idempotency key is its ID, and
// RunOnceTx commits the key (the "done" note), the stock change and the
// answer in one local transaction, so a crash leaves all of them or none.
// The story runs on SQLite, then on bbolt: the same promise, in the two
// embedded stores; and on MySQL or MariaDB too, when IDEM_MYSQL_DSN names
// a database (root@tcp(127.0.0.1:3306)/test).
//
//	go run ./examples/worker
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

func main() {
	if spec := os.Getenv(workerEnv); spec != "" {
		if err := serveWorker(spec, os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "worker:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(1)
	}
}

var (
	order101 = Event{ID: "order-101-placed", Item: "dosa-mix", Delta: -2}
	order102 = Event{ID: "order-102-placed", Item: "idli-rava", Delta: -3}
	order103 = Event{ID: "order-103-placed", Item: "dosa-mix", Delta: -1}
)

func run(w io.Writer) error {
	fmt.Fprintln(w, "Without a done note, the broker's repeat of order-101-placed takes the items out twice:")
	stock := seed["dosa-mix"]
	for range 2 {
		stock += order101.Delta
		fmt.Fprintf(w, "  %s: stock now %d dosa-mix\n", order101.ID, stock)
	}
	dir, err := os.MkdirTemp("", "worker")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	for _, kind := range []string{"sqlite", "bolt"} {
		if err := story(w, kind, filepath.Join(dir, kind+".db")); err != nil {
			return fmt.Errorf("%s: %w", kind, err)
		}
	}
	if os.Getenv(mysqlEnv) == "" {
		return nil
	}
	prefix := fmt.Sprintf("idem_worker_%d_", time.Now().UnixNano())
	defer dropMySQL(prefix)
	if err := story(w, "mysql", prefix); err != nil {
		return fmt.Errorf("mysql: %w", err)
	}
	return nil
}

// story delivers three events, some of them twice, to a worker that is
// killed inside one of them and restarts.
func story(w io.Writer, kind, path string) error {
	where := map[string]string{"sqlite": "SQLite, with the stock and the done notes in one file", "bolt": "bbolt, with the stock and the done notes in one file",
		"mysql": "MySQL, with the stock and the done notes in one database"}[kind]
	fmt.Fprintf(w, "\nThe worker on %s:\n", where)
	wk, err := startWorker(kind, path, crashEnv+"="+order102.ID)
	if err != nil {
		return err
	}
	deliver := func(e Event, why string) error {
		words, err := wk.deliver(e)
		switch {
		case err != nil:
			return err
		case words[0] == "applied":
			fmt.Fprintf(w, "  %s: stock now %s %s%s\n", e.ID, words[2], e.Item, why)
		case words[0] == "skipped":
			fmt.Fprintf(w, "  %s: seen before, skipped%s\n", e.ID, why)
		case words[0] == "inside":
			fmt.Fprintf(w, "  %s: the worker is killed inside its transaction (SIGKILL)\n", e.ID)
			return wk.kill()
		default:
			return fmt.Errorf("%s: %s", e.ID, strings.Join(words, " "))
		}
		return nil
	}
	if err := deliver(order101, ""); err != nil {
		return err
	}
	if err := deliver(order101, " (the broker handed it out again)"); err != nil {
		return err
	}
	if err := deliver(order102, ""); err != nil {
		return err
	}
	fmt.Fprintln(w, "  the worker restarts, and the broker hands out order-102-placed again: it was never acked")
	if wk, err = startWorker(kind, path); err != nil {
		return err
	}
	if err := deliver(order102, " (10 - 3: the killed try left neither its change nor its note)"); err != nil {
		return err
	}
	if err := deliver(order101, " (one more repeat, after the restart)"); err != nil {
		return err
	}
	if err := deliver(order103, ""); err != nil {
		return err
	}
	if err := wk.stop(); err != nil {
		return err
	}
	return final(w, kind, path)
}

// final reads the file the worker left.
func final(w io.Writer, kind, path string) error {
	stock, err := openStock(kind, path, nil)
	if err != nil {
		return err
	}
	defer stock.Close()
	ctx := context.Background()
	levels, err := stock.Levels(ctx)
	if err != nil {
		return err
	}
	done, err := stock.Done(ctx)
	if err != nil {
		return err
	}
	var items []string
	for item, n := range levels {
		items = append(items, fmt.Sprintf("%d %s", n, item))
	}
	slices.Sort(items)
	fmt.Fprintf(w, "  final stock: %s; %d events done, each applied once\n", strings.Join(items, ", "), done)
	return nil
}
