package idemhttp_test

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemhttp"
	"github.com/seed094d4201/idem/sqlite"
)

// A handler that ends its goroutine (runtime.Goexit, as t.FailNow does)
// under Options.InTx is answered as a panic is, as it is without InTx:
// 500, its writes rolled back and its key released. It was taken for a
// commit that failed (503 with Retry-After, logged "did not commit").
func TestHandlerGoexitInTxIsAnsweredAsAPanic(t *testing.T) {
	db, err := sqlite.Open(filepath.Join(t.TempDir(), "x.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	b, err := sqlite.New(context.Background(), db, sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	store := idem.New[idemhttp.Response](idem.Options{Backend: b})
	defer store.Close()
	var logs bytes.Buffer
	runs := 0
	h := idemhttp.Middleware(store, idemhttp.Options{Unscoped: true, InTx: sqlite.InTx[idemhttp.Response], Logger: slog.New(slog.NewTextHandler(&logs, nil))})(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs++
			if runs == 1 {
				runtime.Goexit()
			}
			w.WriteHeader(http.StatusCreated)
		}))
	post := func() *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, "/", strings.NewReader("{}"))
		req.Header.Set(idemhttp.Header, "k")
		w := httptest.NewRecorder()
		done := make(chan struct{})
		go func() { defer close(done); h.ServeHTTP(w, req) }()
		<-done
		return w
	}
	w := post()
	if w.Code != http.StatusInternalServerError {
		t.Errorf("a handler that called runtime.Goexit under InTx answered %d, want 500 as for a panic (and without InTx)", w.Code)
	}
	if !strings.Contains(logs.String(), "runtime.Goexit") || strings.Contains(logs.String(), "did not commit") {
		t.Errorf("logged as a failed commit: %s", logs.String())
	}
	if w2 := post(); w2.Code != http.StatusCreated {
		t.Errorf("the retry = %d, want 201 (the key released)", w2.Code)
	}
}
