package idemhttp_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemhttp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A handler that tries to take the connection over (a WebSocket-or-plain
// endpoint) and, refused, answers normally has that answer replayed
// whole: nothing was hijacked or streamed.
func TestRefusedHijackKeepsTheBody(t *testing.T) {
	var runs atomic.Int32
	h := idemhttp.Middleware(newStore(t, idem.Options{}), idemhttp.Options{Unscoped: true, Logger: quiet()})(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs.Add(1)
			if _, _, err := http.NewResponseController(w).Hijack(); err == nil {
				t.Fatal("the test writer cannot hijack")
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, `{"charge":1}`)
		}))
	do := func() *httptest.ResponseRecorder {
		rr := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodPost, "/", strings.NewReader("{}"))
		req.Header.Set(idemhttp.Header, "k")
		h.ServeHTTP(rr, req)
		return rr
	}
	first := do()
	require.Equal(t, `{"charge":1}`, first.Body.String())
	replay := do()
	assert.Equal(t, int32(1), runs.Load())
	assert.Equal(t, "", replay.Header().Get(idemhttp.BodyOmittedHeader), "nothing was streamed")
	assert.Equal(t, first.Body.String(), replay.Body.String(), "the replay is less than the first answer")
}

// The same over a real HTTP/2 server, where Hijack always fails.
func TestRefusedHijackOverHTTP2KeepsTheBody(t *testing.T) {
	var runs atomic.Int32
	h := idemhttp.Middleware(newStore(t, idem.Options{}), idemhttp.Options{Unscoped: true, Logger: quiet()})(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs.Add(1)
			if _, _, err := http.NewResponseController(w).Hijack(); err == nil {
				t.Error("HTTP/2 cannot hijack")
				return
			}
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, `{"charge":1}`)
		}))
	srv := httptest.NewUnstartedServer(h)
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)
	first, b1 := post(t, srv.Client(), srv.URL, "k", "{}")
	require.Equal(t, 2, first.ProtoMajor)
	retry, b2 := post(t, srv.Client(), srv.URL, "k", "{}")
	assert.Equal(t, int32(1), runs.Load())
	assert.Equal(t, "", retry.Header.Get(idemhttp.BodyOmittedHeader))
	assert.Equal(t, b1, b2)
}

// A handler that took its connection over has answered on it: ReleaseKey
// cannot release its key afterwards, and a retry replays that it ran.
func TestReleaseKeyAfterHijackChangesNothing(t *testing.T) {
	var runs atomic.Int32
	released := make(chan bool, 1)
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		conn, rw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		io.WriteString(rw, "HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n")
		rw.Flush()
		conn.Close()
		released <- idemhttp.ReleaseKey(w)
	}), idemhttp.Options{Unscoped: true})
	first, _ := post(t, srv.Client(), srv.URL, "k", "{}")
	assert.Equal(t, http.StatusNoContent, first.StatusCode, "the answer written on the connection")
	assert.False(t, <-released)
	retry, body := post(t, srv.Client(), srv.URL, "k", "{}")
	assert.Equal(t, http.StatusOK, retry.StatusCode)
	assert.Equal(t, "hijacked", retry.Header.Get(idemhttp.BodyOmittedHeader))
	assert.Empty(t, body)
	assert.Equal(t, int32(1), runs.Load())
}
