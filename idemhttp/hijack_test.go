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

// hijackAfter is a handler that starts its answer through w as start
// says, then takes the connection over and ends it there, counting its
// runs.
func hijackAfter(runs *atomic.Int32, start func(w http.ResponseWriter)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		start(w)
		conn, rw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		io.WriteString(rw, "on the connection")
		rw.Flush()
		conn.Close()
	})
}

// A handler that takes the connection over after starting its answer
// through the ResponseWriter (its headers, part of its body, or a 101
// Switching Protocols, as a WebSocket library's upgrade does) has
// answered on the connection: it is remembered as done, never run
// again, whatever it started with.
func TestHandlerThatHijacksAfterStartingIsNotRunAgain(t *testing.T) {
	for name, start := range map[string]func(w http.ResponseWriter){
		"headers": func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "text/plain")
			w.WriteHeader(http.StatusCreated)
		},
		"part of the body": func(w http.ResponseWriter) {
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, "part")
		},
		"101 Switching Protocols": func(w http.ResponseWriter) {
			w.Header().Set("Connection", "Upgrade")
			w.Header().Set("Upgrade", "tcp")
			w.WriteHeader(http.StatusSwitchingProtocols)
		},
	} {
		t.Run(name, func(t *testing.T) {
			var runs atomic.Int32
			srv := serve(t, hijackAfter(&runs, start), idemhttp.Options{Unscoped: true, Logger: quiet()})
			req, err := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("{}"))
			require.NoError(t, err)
			req.Header.Set(idemhttp.Header, "k")
			if resp, err := srv.Client().Do(req); err == nil { // its answer is its own
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			retry, body := post(t, srv.Client(), srv.URL, "k", "{}")
			assert.Equal(t, int32(1), runs.Load(), "the handler ran again")
			assert.Equal(t, "hijacked", retry.Header.Get(idemhttp.BodyOmittedHeader))
			assert.Less(t, retry.StatusCode, 300, "a replay of a handler that ran")
			assert.GreaterOrEqual(t, retry.StatusCode, 200)
			assert.Empty(t, body)
		})
	}
}

// A handler that takes the connection over and then panics failed
// before commit, as any panic does: its key is released, and the
// connection, which is the handler's, is left to it.
func TestHandlerThatHijacksThenPanicsIsReleased(t *testing.T) {
	var runs atomic.Int32
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) > 1 {
			w.WriteHeader(http.StatusCreated)
			return
		}
		conn, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		conn.Close()
		panic("after the hijack")
	}), idemhttp.Options{Unscoped: true, Logger: quiet()})
	req, err := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("{}"))
	require.NoError(t, err)
	req.Header.Set(idemhttp.Header, "k")
	_, err = srv.Client().Do(req)
	require.Error(t, err, "the connection was closed unanswered")
	// A retry that came while the key was still held waited for the
	// panic and was told so (500, retry with the same key); the next
	// runs the handler again.
	retry, _ := post(t, srv.Client(), srv.URL, "k", "{}")
	if retry.StatusCode == http.StatusInternalServerError {
		retry, _ = post(t, srv.Client(), srv.URL, "k", "{}")
	}
	assert.Equal(t, http.StatusCreated, retry.StatusCode)
	assert.Equal(t, int32(2), runs.Load())
}
