// Command orders tells the story of an operation that resumes instead of
// ending "outcome unknown". An order service places an order in three
// steps (create the order, charge the customer, notify them) and records
// each step as it finishes. The charge goes to a payment service, a real
// idemhttp server, with a key derived from the order's key. The order
// service is killed (SIGKILL) after the payment service charged the card
// but before the order service recorded the charge. The client retries;
// the order service resumes the order: the recorded step is not run
// again, the charge is sent again with the same derived key, and the
// payment service answers with its first charge. The customer is charged
// once, and no operator was needed.
//
//	go run ./examples/orders
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/bolt"
	"github.com/seed094d4201/idem/idemhttp"
)

// The order service runs as a process of its own, so that it can be
// killed for real: this program again, with orderServiceEnv set to its
// bbolt file and paymentsEnv to the payment service's address. It places
// order 101, printing each step, and with killEnv set it stops right after
// the payment service answered the charge, says "killed?", and waits for
// SIGKILL.
const (
	orderServiceEnv = "IDEM_EXAMPLE_ORDERS_FILE"
	paymentsEnv     = "IDEM_EXAMPLE_PAYMENTS"
	killEnv         = "IDEM_EXAMPLE_ORDERS_KILL"
)

func main() {
	if path := os.Getenv(orderServiceEnv); path != "" {
		if err := orderService(path, os.Getenv(paymentsEnv), os.Getenv(killEnv) != "", os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "order service:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "orders:", err)
		os.Exit(1)
	}
}

// Charge is the payment service's answer.
type Charge struct {
	ID     int `json:"id"`
	Amount int `json:"amount"`
}

// payments is the payment service: it charges the card once per
// Idempotency-Key, and keeps the customer's statement.
type payments struct {
	mu      sync.Mutex
	charges []Charge // guarded by mu: the customer's statement
}

func (p *payments) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req struct{ Amount int }
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	p.mu.Lock()
	c := Charge{ID: len(p.charges) + 1, Amount: req.Amount}
	p.charges = append(p.charges, c)
	p.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(c)
}

func run(w io.Writer) error {
	// The payment service: a real HTTP server, guarded by idemhttp.
	ledger := &payments{}
	keys := idem.New[idemhttp.Response](idem.Options{})
	defer keys.Close()
	srv := httptest.NewServer(idemhttp.Middleware(keys, idemhttp.Options{Required: true})(ledger))
	defer srv.Close()

	dir, err := os.MkdirTemp("", "orders")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "orders.db")

	fmt.Fprintln(w, "The order service places order 101: three steps, each recorded as it finishes.")
	if err := killedOrderService(w, path, srv.URL); err != nil {
		return err
	}
	fmt.Fprintln(w, "  the client retries order 101, and the order service resumes it:")
	if err := orderService(path, srv.URL, false, w); err != nil {
		return err
	}
	ledger.mu.Lock()
	defer ledger.mu.Unlock()
	total := 0
	for _, c := range ledger.charges {
		total += c.Amount
	}
	fmt.Fprintf(w, "The customer was charged %d time(s), %d rupees in all; no operator was needed.\n", len(ledger.charges), total)
	return nil
}

// killedOrderService runs the order service as a process of its own and
// kills it with SIGKILL after the charge, before the step is recorded.
func killedOrderService(w io.Writer, path, payments string) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	cmd := exec.Command(exe, "-test.run=^$") // the flag is for the test binary, which runs this too
	cmd.Env = append(os.Environ(), orderServiceEnv+"="+path, paymentsEnv+"="+payments, killEnv+"=1")
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	lines := bufio.NewReader(out)
	for {
		line, err := lines.ReadString('\n')
		if err != nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			return fmt.Errorf("the order service stopped early: %w", err)
		}
		if line == "killed?\n" {
			break
		}
		fmt.Fprint(w, line)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		return err
	}
	_ = cmd.Wait()
	fmt.Fprintln(w, "  the order service is killed (SIGKILL) after the charge, before it recorded it")
	return nil
}

// orderService places order 101 through a store that records steps in a
// bbolt file and resumes what a dead process left.
func orderService(path, payments string, kill bool, w io.Writer) error {
	b, err := bolt.Open(path, nil)
	if err != nil {
		return err
	}
	defer b.Close()
	store := idem.New[string](idem.Options{Backend: b, Resume: true})
	defer store.Close()
	client := &http.Client{Transport: &idemhttp.Transport{}}

	ran := map[string]bool{}
	step := func(ctx context.Context, name string, fn func(context.Context) (string, error)) (string, error) {
		out, err := idem.Step(ctx, name, func(ctx context.Context) (string, error) {
			ran[name] = true
			return fn(ctx)
		})
		if err == nil && !ran[name] {
			out += " (recorded, not run again)"
		}
		fmt.Fprintf(w, "  %s: %s\n", name, out)
		return out, err
	}
	_, err = store.RunOnce(context.Background(), "order-101", "450 rupees", func(ctx context.Context) (string, error) {
		if _, err := step(ctx, "create-order", func(context.Context) (string, error) {
			return "order 101 created", nil
		}); err != nil {
			return "", err
		}
		if _, err := step(ctx, "charge", func(ctx context.Context) (string, error) {
			c, replayed, err := charge(ctx, client, payments, idem.StepKey(ctx))
			if err != nil {
				return "", err
			}
			if kill {
				fmt.Fprintln(w, "killed?")
				select {} // until SIGKILL
			}
			if replayed {
				return fmt.Sprintf("the payment service answered with its first charge (charge %d, %d rupees; Idempotent-Replayed)", c.ID, c.Amount), nil
			}
			return fmt.Sprintf("charged %d rupees (charge %d)", c.Amount, c.ID), nil
		}); err != nil {
			return "", err
		}
		return step(ctx, "notify", func(context.Context) (string, error) {
			return "customer notified", nil
		})
	})
	return err
}

// charge asks the payment service for 450 rupees with key, the step's
// derived key: the same on every run of the order, so a repeat is
// recognised.
func charge(ctx context.Context, client *http.Client, url, key string) (Charge, bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(`{"amount":450}`))
	if err != nil {
		return Charge{}, false, err
	}
	resp, err := client.Do(idemhttp.WithKey(req, key))
	if err != nil {
		return Charge{}, false, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return Charge{}, false, errors.New(resp.Status)
	}
	var c Charge
	err = json.NewDecoder(resp.Body).Decode(&c)
	return c, resp.Header.Get("Idempotent-Replayed") == "true", err
}
