package bench

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemhttp"
)

// chargeJSON is a charge with enough detail to make its JSON about 1 KiB,
// the response the HTTP benchmarks produce and replay.
type chargeJSON struct {
	ID       string            `json:"id"`
	Order    int               `json:"order"`
	Amount   int               `json:"amount"`
	Currency string            `json:"currency"`
	Status   string            `json:"status"`
	Metadata map[string]string `json:"metadata"`
}

var charge = chargeJSON{
	ID: "ch_3PZk8a2eZvKYlo2C1xq7w4Ex", Order: 101, Amount: 450, Currency: "INR", Status: "succeeded",
	Metadata: func() map[string]string {
		m := make(map[string]string)
		for i := range 12 {
			m[fmt.Sprintf("field_%02d", i)] = strings.Repeat("v", 60)
		}
		return m
	}(),
}

// chargeHandler produces the 1 KiB response: it reads the request and
// encodes the charge.
var chargeHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_ = json.NewEncoder(w).Encode(charge)
})

// BenchmarkHTTP measures what the middleware adds to a request, in process
// (no network): the bare handler, the middleware's first request for a key,
// and its replay of the stored response.
func BenchmarkHTTP(b *testing.B) {
	reqBody := []byte(`{"order":101,"amount":450}`)
	serve := func(b *testing.B, h http.Handler, key func(i int) string) {
		b.Helper()
		body := bytes.NewReader(reqBody)
		req := httptest.NewRequest(http.MethodPost, "/charges", body)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if w.Body.Len() < 1000 {
			b.Fatalf("response is %d bytes, want about 1 KiB", w.Body.Len())
		}
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			body.Reset(reqBody)
			req.Header.Set(idemhttp.Header, key(i))
			w.Body.Reset()
			clear(w.Header())
			h.ServeHTTP(w, req)
		}
	}
	newGuard := func(b *testing.B) http.Handler {
		s := idem.New[idemhttp.Response](idem.Options{})
		b.Cleanup(func() { s.Close() })
		return idemhttp.Middleware(s, idemhttp.Options{})(chargeHandler)
	}
	b.Run("impl=bare", func(b *testing.B) {
		serve(b, chargeHandler, func(int) string { return "k" })
	})
	b.Run("impl=idem-first", func(b *testing.B) {
		keys := makeKeys(b.N + 1)
		serve(b, newGuard(b), func(i int) string { return keys[i+1] })
	})
	b.Run("impl=idem-replay", func(b *testing.B) {
		serve(b, newGuard(b), func(int) string { return "16fd2706-8baf-433b-82eb-8c7fada847da" })
	})
}
