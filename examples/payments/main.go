// Command payments is a small payment API guarded by idempotency keys, and a
// client that pays through a network that loses a reply.
//
//	go run ./examples/payments              # the whole story, then exit
//	go run ./examples/payments -grpc        # the same story over gRPC (grpc.go)
//	go run ./examples/payments -serve :8080 # only the API, for curl
//
// The API takes POST /charges with a JSON body {"order":101,"amount":450}
// and an Idempotency-Key header, and lists the ledger at GET /ledger. Its
// charges and its idempotency keys live in one database, SQLite by
// default (a temporary file, or -db FILE), PostgreSQL or MySQL/MariaDB if
// PAYMENTS_DB (or -db) names one:
//
//	PAYMENTS_DB=postgres://127.0.0.1:5432/test go run ./examples/payments
//	PAYMENTS_DB='mysql:root@tcp(127.0.0.1:3306)/test' go run ./examples/payments
//
// Each charge, its key and the response commit in one transaction
// (idemhttp's transactional mode), so a crash leaves all three or none.
// The story starts the API on a loopback port, puts a proxy in front that
// drops the first reply after the API has charged, and pays three orders
// with idemhttp.Transport: the lost reply is retried with the same key and
// replayed, so the ledger holds one charge per order. On PostgreSQL or
// MySQL the story makes tables of its own and drops them at the end.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/seed094d4201/idem/idemhttp"
)

func main() {
	serve := flag.String("serve", "", "only serve the API on this address (for curl), until interrupted")
	db := flag.String("db", os.Getenv("PAYMENTS_DB"), "the database: a SQLite file, a postgres:// URL, or mysql:DSN (default $PAYMENTS_DB, else a temporary SQLite file)")
	delay := flag.Duration("delay", 0, "with -serve: make each charge take this long, to see a duplicate answered 409")
	overGRPC := flag.Bool("grpc", false, "tell the story over gRPC, with idemgrpc's interceptors")
	flag.Parse()
	var err error
	switch {
	case *serve != "":
		err = serveOnly(*serve, *db, *delay)
	case *overGRPC:
		err = runGRPC(os.Stdout)
	default:
		err = run(os.Stdout, *db)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "payments:", err)
		os.Exit(1)
	}
}

// Charge is one row of the ledger.
type Charge struct {
	ID     int `json:"charge"`
	Order  int `json:"order"`
	Amount int `json:"amount"`
}

// API is the payment service: a ledger of charges in a database, and its
// idempotency keys beside it.
type API struct {
	ledger  *ledger
	handler http.Handler
	delay   time.Duration // how long a charge takes
}

// NewAPI opens the database dsn names (see openLedger) and builds the
// API's handler. Each charge takes at least delay.
func NewAPI(ctx context.Context, dsn, prefix string, delay time.Duration) (*API, error) {
	l, err := openLedger(ctx, dsn, prefix)
	if err != nil {
		return nil, err
	}
	a := &API{ledger: l, delay: delay}
	guard := idemhttp.Middleware(l.keys, idemhttp.Options{
		Required:    true,
		Wait:        2 * time.Second, // a duplicate waits this long for the first request, then 409
		Fingerprint: idemhttp.JSONFingerprint,
		// One tenant must never see another's stored responses. A real API
		// takes the account from its authentication; this one from a header.
		Scope: func(r *http.Request) (string, error) { return r.Header.Get("X-Account"), nil },
		// The charge, its key and the response commit in one transaction:
		// a crash leaves all of them or none, never a charge whose answer
		// is lost.
		InTx: l.inTx,
	})
	mux := http.NewServeMux()
	mux.Handle("POST /charges", guard(http.HandlerFunc(a.charge)))
	mux.HandleFunc("GET /ledger", a.listLedger)
	a.handler = mux
	return a, nil
}

func (a *API) Close() { a.ledger.close() }

func (a *API) ServeHTTP(w http.ResponseWriter, r *http.Request) { a.handler.ServeHTTP(w, r) }

// charge takes the money: it is not idempotent by itself. It writes
// through the request's transaction, which the middleware commits with
// the key and this response.
func (a *API) charge(w http.ResponseWriter, r *http.Request) {
	var req struct{ Order, Amount int }
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Order <= 0 || req.Amount <= 0 {
		http.Error(w, `{"error":"want {\"order\":N,\"amount\":N}"}`, http.StatusBadRequest)
		return
	}
	// -delay makes a charge slow, to see a duplicate answered 409. It waits
	// inside the transaction, holding its locks, as no real remote call
	// should: call the bank before, or through idem.Step.
	time.Sleep(a.delay)
	id, err := a.ledger.insert(r.Context(), req.Order, req.Amount)
	if err != nil {
		// A 5xx rolls the charge back with the key: the retry runs afresh.
		http.Error(w, `{"error":"the ledger is unavailable"}`, http.StatusServiceUnavailable)
		return
	}
	c := Charge{ID: id, Order: req.Order, Amount: req.Amount}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", fmt.Sprintf("/charges/%d", c.ID))
	w.WriteHeader(http.StatusCreated)
	_ = json.NewEncoder(w).Encode(c)
}

func (a *API) Ledger(ctx context.Context) ([]Charge, error) { return a.ledger.list(ctx) }

func (a *API) listLedger(w http.ResponseWriter, r *http.Request) {
	charges, err := a.Ledger(r.Context())
	if err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(charges)
}

// lossyProxy forwards to the API, but cuts the connection instead of
// replying to the first lose requests: the API did the work, the reply is
// lost on the way back.
type lossyProxy struct {
	api  string
	lose int32
	seen atomic.Int32
}

func (p *lossyProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	out, err := http.NewRequestWithContext(r.Context(), r.Method, p.api+r.URL.RequestURI(), r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	out.Header = r.Header.Clone()
	resp, err := http.DefaultTransport.RoundTrip(out)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	if p.seen.Add(1) <= p.lose {
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			conn.Close()
		}
		return
	}
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(w, resp.Body)
}

// listen serves h on a loopback port and returns its URL and a stop func.
func listen(h http.Handler) (string, func(), error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	return "http://" + ln.Addr().String(), func() { _ = srv.Shutdown(context.Background()) }, nil
}

// run tells the story on the database dsn names, or on a temporary SQLite
// file if dsn is empty.
func run(w io.Writer, dsn string) error {
	ctx := context.Background()
	prefix := ""
	if dsn == "" {
		dir, err := os.MkdirTemp("", "payments")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		dsn = filepath.Join(dir, "payments.db")
	} else if !isFile(dsn) { // a shared database: tables of this run's own
		prefix = fmt.Sprintf("payments_%d_", time.Now().UnixNano())
	}
	api, err := NewAPI(ctx, dsn, prefix, 0)
	if err != nil {
		return err
	}
	defer api.Close()
	if prefix != "" {
		defer api.ledger.drop(ctx)
	}
	apiURL, stopAPI, err := listen(api)
	if err != nil {
		return err
	}
	defer stopAPI()
	proxy := &lossyProxy{api: apiURL, lose: 1}
	proxyURL, stopProxy, err := listen(proxy)
	if err != nil {
		return err
	}
	defer stopProxy()

	client := &http.Client{Transport: &idemhttp.Transport{MinBackoff: 10 * time.Millisecond}}
	fmt.Fprintln(w, "Paying three orders through a network that loses the first reply:")
	for _, o := range []struct{ order, amount int }{{101, 450}, {102, 990}, {103, 120}} {
		key := idemhttp.NewKey() // made with the order; a real shop stores it there
		body := fmt.Sprintf(`{"order":%d,"amount":%d}`, o.order, o.amount)
		req, err := http.NewRequest(http.MethodPost, proxyURL+"/charges", strings.NewReader(body))
		if err != nil {
			return err
		}
		req.Header.Set("X-Account", "shop-7")
		resp, err := client.Do(idemhttp.WithKey(req, key))
		if err != nil {
			return err
		}
		var c Charge
		err = json.NewDecoder(resp.Body).Decode(&c)
		resp.Body.Close()
		if err != nil {
			return err
		}
		note := ""
		if resp.Header.Get(idemhttp.ReplayedHeader) == "true" {
			note = " (a retry after the lost reply, answered from the stored response)"
		}
		fmt.Fprintf(w, "  order %d: %s, charge %d%s\n", o.order, resp.Status, c.ID, note)
	}

	fmt.Fprintln(w, "The ledger:")
	perOrder := make(map[int]int)
	charges, err := api.Ledger(ctx)
	if err != nil {
		return err
	}
	for _, c := range charges {
		fmt.Fprintf(w, "  charge %d: order %d, %d rupees\n", c.ID, c.Order, c.Amount)
		perOrder[c.Order]++
	}
	once := len(perOrder) == 3
	for _, n := range perOrder {
		once = once && n == 1
	}
	fmt.Fprintf(w, "One charge per order: %v (the proxy dropped %d reply)\n", once, min(proxy.seen.Load(), proxy.lose))
	if !once {
		return errors.New("an order was charged twice")
	}
	return nil
}

// serveOnly runs the API on addr until the process is interrupted.
func serveOnly(addr, path string, delay time.Duration) error {
	if path == "" {
		dir, err := os.MkdirTemp("", "payments")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		path = filepath.Join(dir, "payments.db")
	}
	api, err := NewAPI(context.Background(), path, "payments_", delay)
	if err != nil {
		return err
	}
	defer api.Close()
	log.Printf("payment API on %s, charges and keys in %s", addr, redact(path))
	srv := &http.Server{Addr: addr, Handler: api, ReadHeaderTimeout: 5 * time.Second}
	return srv.ListenAndServe()
}

// isFile reports whether dsn names a SQLite file rather than a server.
func isFile(dsn string) bool {
	return !strings.HasPrefix(dsn, "postgres://") && !strings.HasPrefix(dsn, "postgresql://") && !strings.HasPrefix(dsn, "mysql:")
}

// redact hides a password a server DSN may carry, for the log.
func redact(dsn string) string {
	if isFile(dsn) {
		return dsn
	}
	return strings.SplitN(dsn, "@", 2)[len(strings.SplitN(dsn, "@", 2))-1]
}
