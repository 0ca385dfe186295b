package sqlite_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemhttp"
	"github.com/seed094d4201/idem/sqlite"
)

// A payment handler whose charge row, Idempotency-Key and response commit
// in one transaction: the middleware sends the response only after that
// commit, and a retry replays it.
func ExampleInTx() {
	dir, _ := os.MkdirTemp("", "idem-example")
	defer os.RemoveAll(dir)
	db, err := sqlite.Open(filepath.Join(dir, "payments.db"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer db.Close()
	b, err := sqlite.New(context.Background(), db, sqlite.Options{})
	if err == nil {
		_, err = db.Exec(`CREATE TABLE charges (id INTEGER PRIMARY KEY, amount INTEGER)`)
	}
	if err != nil {
		fmt.Println(err)
		return
	}
	store := idem.New[idemhttp.Response](idem.Options{Backend: b})
	defer store.Close()

	charge := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, _ := sqlite.TxFromContext(r.Context())
		var id int64
		err := tx.QueryRowContext(r.Context(), `INSERT INTO charges (amount) VALUES (1250) RETURNING id`).Scan(&id)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError) // a 5xx rolls the charge back
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "charge %d\n", id)
	})
	mw := idemhttp.Middleware(store, idemhttp.Options{Unscoped: true, InTx: sqlite.InTx[idemhttp.Response]})
	srv := httptest.NewServer(mw(charge))
	defer srv.Close()

	for range 3 { // the client retries the same payment
		req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(`{"amount":1250}`))
		req.Header.Set(idemhttp.Header, "pay-7f3a")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			fmt.Println(err)
			return
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Print(resp.StatusCode, " replayed=", resp.Header.Get("Idempotent-Replayed") == "true", " ", string(body))
	}
	var n int
	_ = db.QueryRow(`SELECT count(*) FROM charges`).Scan(&n)
	fmt.Println("charges:", n)
	// Output:
	// 201 replayed=false charge 1
	// 201 replayed=true charge 1
	// 201 replayed=true charge 1
	// charges: 1
}
