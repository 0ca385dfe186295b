package bench

import (
	"context"
	"database/sql"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemhttp"
	"github.com/seed094d4201/idem/mysql"
	"github.com/seed094d4201/idem/postgres"
)

// BenchmarkHTTPTx: a first request whose handler inserts one charge row,
// in idemhttp's transactional mode (impl=idem: the row, the key and the
// response committed in one transaction) against a bare handler that
// inserts the same row in a transaction of its own (impl=bare), on
// PostgreSQL and MySQL, by 1 and 16 callers. impl=roundtrip is one
// SELECT 1 on the same pool: the price of one round trip, the most the
// transactional mode may add to the bare handler.
func BenchmarkHTTPTx(b *testing.B) {
	for _, db := range []struct {
		name string
		new  func(b *testing.B) httpTxBench
	}{
		{"postgres", pgHTTPTx},
		{"mysql", mysqlHTTPTx},
	} {
		for _, g := range []int{1, 16} {
			for _, impl := range []string{"bare", "idem", "roundtrip"} {
				b.Run(fmt.Sprintf("db=%s/impl=%s/g=%d", db.name, impl, g), func(b *testing.B) {
					tb := db.new(b)
					var op func(i int)
					switch impl {
					case "roundtrip":
						op = func(int) { tb.roundTrip() }
					default:
						h := tb.bare
						if impl == "idem" {
							h = tb.guarded
						}
						keys := makeKeys(b.N)
						op = func(i int) { serveCharge(b, h, keys[i]) }
					}
					forEach(b, g, op)
				})
			}
		}
	}
}

// httpTxBench is one database's handlers for BenchmarkHTTPTx.
type httpTxBench struct {
	bare, guarded http.Handler
	roundTrip     func()
}

const chargeBody = `{"order":101,"amount":450}`

// serveCharge sends one charge with key to h and checks its answer.
func serveCharge(b *testing.B, h http.Handler, key string) {
	req := httptest.NewRequest(http.MethodPost, "/charges", strings.NewReader(chargeBody))
	req.Header.Set(idemhttp.Header, key)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	if w.Code != http.StatusCreated {
		b.Fatalf("status %d: %s", w.Code, w.Body)
	}
}

// answer writes the response both handlers give.
func answer(w http.ResponseWriter, id int64) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"charge":%d,"order":101,"amount":450}`, id)
}

func txMiddleware(b *testing.B, be idem.Options, inTx func(context.Context, *idem.Store[idemhttp.Response], string, any, func(context.Context) (idemhttp.Response, error)) (idemhttp.Response, error)) func(http.Handler) http.Handler {
	s := idem.New[idemhttp.Response](idem.Options{Backend: be.Backend, TTL: time.Minute})
	b.Cleanup(func() { s.Close() })
	return idemhttp.Middleware(s, idemhttp.Options{Unscoped: true, InTx: inTx})
}

func pgHTTPTx(b *testing.B) httpTxBench {
	pool := pgPool(b)
	charges := uniqueName("charges_")
	keys := uniqueName("idem_bench_")
	ctx := context.Background()
	be, err := postgres.New(ctx, pool, postgres.Options{Table: keys})
	if err == nil {
		_, err = pool.Exec(ctx, `CREATE TABLE `+charges+` (id BIGSERIAL PRIMARY KEY, ord INT NOT NULL, amount INT NOT NULL)`)
	}
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+charges+", "+keys) })
	insert := `INSERT INTO ` + charges + ` (ord, amount) VALUES (101, 450) RETURNING id`
	bare := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		tx, err := pool.Begin(ctx)
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		defer tx.Rollback(ctx)
		var id int64
		if err := tx.QueryRow(ctx, insert).Scan(&id); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		if err := tx.Commit(ctx); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		answer(w, id)
	})
	inTx := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, _ := postgres.TxFromContext(r.Context())
		var id int64
		if err := tx.QueryRow(r.Context(), insert).Scan(&id); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		answer(w, id)
	})
	return httpTxBench{
		bare:      bare,
		guarded:   txMiddleware(b, idem.Options{Backend: be}, postgres.InTx[idemhttp.Response])(inTx),
		roundTrip: func() { pgSelectOne(b, pool) },
	}
}

func pgSelectOne(b *testing.B, pool *pgxpool.Pool) {
	var one int
	if err := pool.QueryRow(context.Background(), `SELECT 1`).Scan(&one); err != nil {
		b.Fatal(err)
	}
}

func mysqlHTTPTx(b *testing.B) httpTxBench {
	db := mysqlDB(b)
	charges := uniqueName("charges_")
	keys := uniqueName("idem_bench_")
	ctx := context.Background()
	be, err := mysql.New(ctx, db, mysql.Options{Table: keys})
	if err == nil {
		_, err = db.ExecContext(ctx, `CREATE TABLE `+charges+` (id BIGINT AUTO_INCREMENT PRIMARY KEY, ord INT NOT NULL, amount INT NOT NULL) ENGINE = InnoDB`)
	}
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { db.Exec("DROP TABLE IF EXISTS " + charges + ", " + keys) })
	insert := `INSERT INTO ` + charges + ` (ord, amount) VALUES (101, 450)`
	write := func(ctx context.Context, tx *sql.Tx) (int64, error) {
		res, err := tx.ExecContext(ctx, insert)
		if err != nil {
			return 0, err
		}
		return res.LastInsertId()
	}
	bare := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		defer tx.Rollback()
		id, err := write(ctx, tx)
		if err == nil {
			err = tx.Commit()
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		answer(w, id)
	})
	inTx := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, _ := mysql.TxFromContext(r.Context())
		id, err := write(r.Context(), tx)
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		answer(w, id)
	})
	return httpTxBench{
		bare:    bare,
		guarded: txMiddleware(b, idem.Options{Backend: be}, mysql.InTx[idemhttp.Response])(inTx),
		roundTrip: func() {
			var one int
			if err := db.QueryRow(`SELECT 1`).Scan(&one); err != nil {
				b.Fatal(err)
			}
		},
	}
}
