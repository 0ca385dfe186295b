package idemhttp_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemhttp"
)

// A payment handler guarded by idempotency keys: the retry of a request is
// answered with the stored response, and the handler runs once.
func ExampleMiddleware() {
	store := idem.New[idemhttp.Response](idem.Options{})
	defer store.Close()
	charges := 0
	guard := idemhttp.Middleware(store, idemhttp.Options{
		Required: true,
		// One client must never read another's response.
		Scope: func(r *http.Request) (string, error) { return r.Header.Get("X-Account"), nil },
	})
	srv := httptest.NewServer(guard(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		charges++
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"charge":%d}`, charges)
	})))
	defer srv.Close()

	for range 2 { // the first request, then its retry
		req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(`{"order":101}`))
		req.Header.Set(idemhttp.Header, "16fd2706-8baf-433b-82eb-8c7fada847da")
		req.Header.Set("X-Account", "shop-7")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			panic(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Println(resp.StatusCode, string(body), "replayed:", resp.Header.Get(idemhttp.ReplayedHeader) == "true")
	}
	fmt.Println("charges:", charges)
	// Output:
	// 201 {"charge":1} replayed: false
	// 201 {"charge":1} replayed: true
	// charges: 1
}

// A client that sends one key on every attempt of a logical request, and
// retries only what leaves the outcome unknown.
func ExampleTransport() {
	client := &http.Client{Transport: &idemhttp.Transport{}}
	req, _ := http.NewRequest(http.MethodPost, "https://payments.example/charges", strings.NewReader(`{"order":101}`))
	// The key made with the order, stored with it, and sent on every retry.
	req = idemhttp.WithKey(req, "16fd2706-8baf-433b-82eb-8c7fada847da")
	_ = client // client.Do(req) retries 409, 425, 429, 502, 503, 504 and network errors with that key
	fmt.Println(req.Method, req.URL.Path)
	// Output: POST /charges
}
