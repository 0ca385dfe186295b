package multiproc

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemhttp"
	"github.com/seed094d4201/idem/mysql"
	"github.com/seed094d4201/idem/postgres"
	"github.com/seed094d4201/idem/sqlite"
)

// The HTTP server of the transactional kill loop (httptx_test.go) is this
// test binary started with httpTxEnv set. It serves, on the listener it
// inherits as fd 3, a charge handler behind idemhttp.Middleware with InTx,
// says "ready", and works until it is SIGKILLed. A line on stdin, "pause
// pre" or "pause post", makes the next fresh run stop for good at that
// point, saying "paused pre|post ORDER" first, for the kill to land there:
//
//	pre:  the handler has inserted its charge and written its (held)
//	      response, and is about to return: nothing is committed yet;
//	post: the handler's rows, the key and the response have committed, and
//	      the response is about to be sent: nothing of it is sent yet.
const (
	httpTxEnv        = "IDEM_HTTPTX_CHILD"   // the backend: "postgres", "mysql" or "sqlite"
	httpTxNameEnv    = "IDEM_HTTPTX_NAME"    // postgres, mysql: the store's table; sqlite: the database file
	httpTxChargesEnv = "IDEM_HTTPTX_CHARGES" // the charges table
)

// The pause points a child can be told to stop at.
const (
	pauseNone int32 = iota
	pausePre
	pausePost
)

// init runs the child, before TestMain, when httpTxEnv says this process is
// one: the child needs nothing of the testing package, and this keeps the
// whole mode in this file.
func init() {
	if os.Getenv(httpTxEnv) == "" {
		return
	}
	fmt.Fprintln(os.Stderr, "httptx child:", runHTTPTxChild())
	os.Exit(1)
}

// runHTTPTxChild serves until the process is killed; it returns only on an
// error it cannot go on from.
func runHTTPTxChild() error {
	ctx := context.Background()
	db, err := openHTTPTxDB(ctx, os.Getenv(httpTxEnv), os.Getenv(httpTxNameEnv), os.Getenv(httpTxChargesEnv))
	if err != nil {
		return err
	}
	ln, err := net.FileListener(os.NewFile(3, "listener"))
	if err != nil {
		return fmt.Errorf("inherited listener: %w", err)
	}
	store := idem.New[idemhttp.Response](idem.Options{Backend: db.backend})
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	mw := idemhttp.Middleware(store, idemhttp.Options{Unscoped: true, Required: true, InTx: db.inTx, Logger: logger})

	var armed atomic.Int32 // the pause point the next fresh run stops at
	pause := func(where int32, name, order string) {
		if armed.CompareAndSwap(where, pauseNone) {
			fmt.Printf("paused %s %s\n", name, order)
			<-make(chan struct{}) // until SIGKILL
		}
	}
	go func() {
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			switch sc.Text() {
			case "pause pre":
				armed.Store(pausePre)
			case "pause post":
				armed.Store(pausePost)
			}
		}
	}()

	pid := os.Getpid()
	var runs atomic.Int64
	charge := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req httpTxOrder
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Order == "" {
			http.Error(w, "bad order", http.StatusBadRequest)
			return
		}
		// The body names this run, so the checks can tell which run's
		// answer a client got: the one committed with the charge row.
		body := fmt.Sprintf(`{"order":%q,"amount":%d,"run":"%d.%d"}`+"\n", req.Order, req.Amount, pid, runs.Add(1))
		if err := db.insert(r.Context(), req.Order, body); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError) // rolled back with the claim
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(body))
		pause(pausePre, "pre", req.Order)
	})
	handler := mw(charge)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		order := strings.TrimPrefix(idemhttpKey(r), "key-")
		handler.ServeHTTP(&pauseWriter{ResponseWriter: w, pause: func() { pause(pausePost, "post", order) }}, r)
	})}
	fmt.Println("ready")
	return srv.Serve(ln)
}

// idemhttpKey is the request's Idempotency-Key, bare.
func idemhttpKey(r *http.Request) string { return strings.Trim(r.Header.Get(idemhttp.Header), `"`) }

// A pauseWriter calls pause when the middleware starts to send a fresh
// run's 201: in the transactional mode, only after its commit.
type pauseWriter struct {
	http.ResponseWriter
	pause func()
}

func (w *pauseWriter) WriteHeader(status int) {
	if status == http.StatusCreated && w.Header().Get(idemhttp.ReplayedHeader) == "" {
		w.pause()
	}
	w.ResponseWriter.WriteHeader(status)
}

func (w *pauseWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// httpTxOrder is a request's body: fixed per order, on every attempt.
type httpTxOrder struct {
	Order  string `json:"order"`
	Amount int    `json:"amount"`
}

// An httpTxDB is one backend's database, seen by the child (the store's
// Backend, its InTx, the insert of a charge through the request's
// transaction) and by the test (the charges, the records).
type httpTxDB struct {
	backend backend.Backend
	inTx    func(context.Context, *idem.Store[idemhttp.Response], string, any, func(context.Context) (idemhttp.Response, error)) (idemhttp.Response, error)
	insert  func(ctx context.Context, order, body string) error
	charges func(ctx context.Context) (map[string][]string, error) // order -> the bodies of its charge rows
	close   func()
}

var errNoTx = errors.New("the request's context carries no transaction")

// openHTTPTxDB opens the backend kind: its store table (or file) name, and
// the charges table, which it creates if there is none.
func openHTTPTxDB(ctx context.Context, kind, name, charges string) (*httpTxDB, error) {
	switch kind {
	case "postgres":
		cfg, err := pgxpool.ParseConfig(os.Getenv("IDEM_POSTGRES_DSN"))
		if err != nil {
			return nil, err
		}
		cfg.MaxConns = 16 // runs hold one each, and duplicates wait on their row locks with one more
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			return nil, err
		}
		b, err := postgres.New(ctx, pool, postgres.Options{Table: name})
		if err == nil {
			_, err = pool.Exec(ctx, "CREATE TABLE IF NOT EXISTS "+charges+" (id bigserial PRIMARY KEY, order_id text NOT NULL, body text NOT NULL)")
		}
		if err != nil {
			pool.Close()
			return nil, err
		}
		return &httpTxDB{
			backend: b,
			inTx:    postgres.InTx[idemhttp.Response],
			insert: func(ctx context.Context, order, body string) error {
				tx, ok := postgres.TxFromContext(ctx)
				if !ok {
					return errNoTx
				}
				_, err := tx.Exec(ctx, "INSERT INTO "+charges+" (order_id, body) VALUES ($1, $2)", order, body)
				return err
			},
			charges: func(ctx context.Context) (map[string][]string, error) {
				rows, err := pool.Query(ctx, "SELECT order_id, body FROM "+charges)
				if err != nil {
					return nil, err
				}
				defer rows.Close()
				m := map[string][]string{}
				for rows.Next() {
					var order, body string
					if err := rows.Scan(&order, &body); err != nil {
						return nil, err
					}
					m[order] = append(m[order], body)
				}
				return m, rows.Err()
			},
			close: pool.Close,
		}, nil
	case "mysql", "sqlite":
		var db *sql.DB
		var b backend.Backend
		var err error
		inTx, txOf := mysql.InTx[idemhttp.Response], mysql.TxFromContext
		create := "CREATE TABLE IF NOT EXISTS " + charges + " (id BIGINT AUTO_INCREMENT PRIMARY KEY, order_id VARCHAR(64) NOT NULL, body TEXT NOT NULL) ENGINE = InnoDB"
		if kind == "mysql" {
			if db, err = sql.Open("mysql", os.Getenv("IDEM_MYSQL_DSN")); err == nil {
				b, err = mysql.New(ctx, db, mysql.Options{Table: name})
			}
		} else {
			inTx, txOf = sqlite.InTx[idemhttp.Response], sqlite.TxFromContext
			create = "CREATE TABLE IF NOT EXISTS " + charges + " (id INTEGER PRIMARY KEY, order_id TEXT NOT NULL, body TEXT NOT NULL)"
			if db, err = sqlite.Open(name); err == nil {
				b, err = sqlite.New(ctx, db, sqlite.Options{})
			}
		}
		if err == nil {
			_, err = db.ExecContext(ctx, create)
		}
		if err != nil {
			if db != nil {
				db.Close()
			}
			return nil, err
		}
		return &httpTxDB{
			backend: b,
			inTx:    inTx,
			insert: func(ctx context.Context, order, body string) error {
				tx, ok := txOf(ctx)
				if !ok {
					return errNoTx
				}
				_, err := tx.ExecContext(ctx, "INSERT INTO "+charges+" (order_id, body) VALUES (?, ?)", order, body)
				return err
			},
			charges: func(ctx context.Context) (map[string][]string, error) {
				rows, err := db.QueryContext(ctx, "SELECT order_id, body FROM "+charges)
				if err != nil {
					return nil, err
				}
				defer rows.Close()
				m := map[string][]string{}
				for rows.Next() {
					var order, body string
					if err := rows.Scan(&order, &body); err != nil {
						return nil, err
					}
					m[order] = append(m[order], body)
				}
				return m, rows.Err()
			},
			close: func() { db.Close() },
		}, nil
	}
	return nil, fmt.Errorf("httptx: unknown backend %q", kind)
}
