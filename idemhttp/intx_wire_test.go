package idemhttp_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemhttp"
	"github.com/seed094d4201/idem/sqlite"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// txStore returns a store over a SQLite file of the test's own, for the
// transactional mode.
func txStore(t *testing.T) *idem.Store[idemhttp.Response] {
	t.Helper()
	db, err := sqlite.Open(filepath.Join(t.TempDir(), "keys.db"))
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	b, err := sqlite.New(context.Background(), db, sqlite.Options{})
	require.NoError(t, err)
	s := idem.New[idemhttp.Response](idem.Options{Backend: b})
	t.Cleanup(func() { s.Close() })
	return s
}

// wire sends one POST with key over a fresh connection to url and returns
// what came back, informational responses included, as one line each:
// status, headers (but Date), body, read error, trailers, length and
// transfer coding.
func wire(t *testing.T, url, key string) string {
	t.Helper()
	conn, err := net.Dial("tcp", url[len("http://"):])
	require.NoError(t, err)
	defer conn.Close()
	_, err = fmt.Fprintf(conn, "POST / HTTP/1.1\r\nHost: x\r\nIdempotency-Key: %s\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}", key)
	require.NoError(t, err)
	br := bufio.NewReader(conn)
	var out string
	for {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			return out + "ERR " + err.Error()
		}
		body, err := io.ReadAll(resp.Body)
		resp.Header.Del("Date")
		out += fmt.Sprintf("%d %v body=%q err=%v trailer=%v cl=%d te=%v\n", resp.StatusCode, resp.Header, body, err, resp.Trailer, resp.ContentLength, resp.TransferEncoding)
		if resp.StatusCode >= 200 {
			return out
		}
	}
}

// In the transactional mode the response held until the commit goes out
// as net/http sends it from a handler that is not guarded at all: the
// status, the headers as they stood at WriteHeader (not those set after
// it), the body, and the trailers once, as trailers (declared in a Trailer
// header or set with http.TrailerPrefix, with no body, or a value set
// before WriteHeader too); an informational 103 first; a second
// WriteHeader ignored; a Content-Length the body does not match; a body
// written after a 204. So does the middleware without InTx.
func TestTxModeSendsTheResponseAsAnUnguardedHandlerWould(t *testing.T) {
	cases := map[string]http.HandlerFunc{
		"trailer-after-body": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Trailer", "X-Sum")
			w.WriteHeader(201)
			io.WriteString(w, "abc")
			w.Header().Set("X-Sum", "1")
		},
		"trailer-early-and-late": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Trailer", "X-Sum")
			w.Header().Set("X-Sum", "early")
			w.WriteHeader(201)
			io.WriteString(w, "abc")
			w.Header().Set("X-Sum", "late")
		},
		"trailer-early-only-implicit-header": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Trailer", "X-Sum")
			w.Header().Set("X-Sum", "early")
			io.WriteString(w, "abc")
		},
		"trailer-no-body": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Trailer", "X-Sum")
			w.Header().Set("X-Sum", "v")
		},
		"trailer-prefix": func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, "abc")
			w.Header().Set(http.TrailerPrefix+"X-Late", "v")
		},
		"trailer-prefix-before-header": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set(http.TrailerPrefix+"X-Late", "v")
			w.WriteHeader(202)
			io.WriteString(w, "abc")
		},
		"early-hints": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Link", "</a.css>; rel=preload")
			w.WriteHeader(103)
			w.Header().Set("X-After", "1")
			w.WriteHeader(201)
			io.WriteString(w, "abc")
		},
		"twice": func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(201)
			w.WriteHeader(202)
			io.WriteString(w, "abc")
		},
		"header-after": func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(201)
			w.Header().Set("X-After", "1")
			io.WriteString(w, "abc")
		},
		"cl-short": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Length", "10")
			io.WriteString(w, "abc")
		},
		"cl-long": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Length", "2")
			io.WriteString(w, "abc")
		},
		"204-body": func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(204)
			io.WriteString(w, "abc")
		},
		"nothing": func(w http.ResponseWriter, r *http.Request) {},
		"header-only": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("X-A", "1")
		},
		"large-sniff": func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, "<html><body>hello</body></html>")
		},
		"larger-than-a-chunk": func(w http.ResponseWriter, r *http.Request) {
			for range 100 {
				io.WriteString(w, "0123456789012345678901234567890123456789012345678901234567890123456789")
			}
		},
		"head-te": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Transfer-Encoding", "chunked")
			io.WriteString(w, "abc")
		},
		"connection-close": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Connection", "close")
			io.WriteString(w, "abc")
		},
	}
	for name, h := range cases {
		t.Run(name, func(t *testing.T) {
			bare := httptest.NewServer(h)
			defer bare.Close()
			held := httptest.NewServer(idemhttp.Middleware(txStore(t), idemhttp.Options{Unscoped: true, InTx: sqlite.InTx[idemhttp.Response]})(h))
			defer held.Close()
			plain := httptest.NewServer(idemhttp.Middleware(newStore(t, idem.Options{}), idemhttp.Options{Unscoped: true})(h))
			defer plain.Close()
			want := wire(t, bare.URL, "k")
			assert.Equal(t, want, wire(t, held.URL, "k"), "held")
			assert.Equal(t, want, wire(t, plain.URL, "k"), "plain")
		})
	}
}
