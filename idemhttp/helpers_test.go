package idemhttp_test

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemhttp"
	"github.com/stretchr/testify/require"
)

// charges is a payment handler that counts its runs and answers 201 with
// the charge number, a Location, and a cookie that must never be replayed.
type charges struct{ n atomic.Int32 }

func (c *charges) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	n := c.n.Add(1)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", fmt.Sprintf("/charges/%d", n))
	w.Header().Set("Set-Cookie", "session=secret")
	w.Header().Set("X-Custom", "replayed too")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"charge":%d,"request":%q}`, n, body)
}

// newStore returns an in-memory response store closed when the test ends.
func newStore(t *testing.T, opts idem.Options) *idem.Store[idemhttp.Response] {
	t.Helper()
	s := idem.New[idemhttp.Response](opts)
	t.Cleanup(func() { s.Close() })
	return s
}

// serve starts a real TCP server with the middleware over h.
func serve(t *testing.T, h http.Handler, opts idemhttp.Options) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(idemhttp.Middleware(newStore(t, idem.Options{}), opts)(h))
	t.Cleanup(srv.Close)
	return srv
}

// post sends a POST with body and, if key is not empty, an Idempotency-Key.
func post(t *testing.T, client *http.Client, url, key, body string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	require.NoError(t, err)
	if key != "" {
		req.Header.Set(idemhttp.Header, key)
	}
	resp, err := client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, string(b)
}

// yield yields while a test spins on a condition other goroutines
// make true.
func yield() { runtime.Gosched() }

// quiet is a logger that drops what it is given, for tests whose
// handlers fail on purpose.
func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
