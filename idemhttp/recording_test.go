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

// noFlush is an outer middleware's writer that does not flush (and has no
// Unwrap).
type noFlush struct{ w http.ResponseWriter }

func (n noFlush) Header() http.Header         { return n.w.Header() }
func (n noFlush) Write(p []byte) (int, error) { return n.w.Write(p) }
func (n noFlush) WriteHeader(c int)           { n.w.WriteHeader(c) }

// A Flush that cannot flush (the writer outside the guard does not) is an
// error to the handler and streams nothing: the body is replayed whole.
func TestFlushThatCannotFlushKeepsTheBody(t *testing.T) {
	mw := idemhttp.Middleware(newStore(t, idem.Options{}), idemhttp.Options{Unscoped: true, Logger: quiet()})
	var flushErr error
	inner := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "whole body")
		flushErr = http.NewResponseController(w).Flush()
	}))
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { inner.ServeHTTP(noFlush{w}, r) })
	do := func() *httptest.ResponseRecorder {
		rr := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodPost, "/", strings.NewReader("{}"))
		req.Header.Set(idemhttp.Header, "k")
		h.ServeHTTP(rr, req)
		return rr
	}
	first := do()
	replay := do()
	assert.Error(t, flushErr, "the handler is told no flush happened")
	assert.Equal(t, first.Body.String(), replay.Body.String())
}

// A handler that calls ReleaseKey (it failed) and then writes its own 4xx
// anyway has that answer remembered whole.
func TestWriteAfterReleaseKeyIsRememberedWhole(t *testing.T) {
	var runs atomic.Int32
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		idemhttp.ReleaseKey(w)
		w.WriteHeader(http.StatusBadRequest)
		io.WriteString(w, `{"error":"bad card"}`)
	}), idemhttp.Options{Unscoped: true, Logger: quiet()})
	_, b1 := post(t, srv.Client(), srv.URL, "k", "{}")
	replay, b2 := post(t, srv.Client(), srv.URL, "k", "{}")
	assert.Equal(t, "true", replay.Header.Get(idemhttp.ReplayedHeader))
	assert.Empty(t, replay.Header.Get(idemhttp.BodyOmittedHeader))
	assert.Equal(t, b1, b2)
	assert.Equal(t, int32(1), runs.Load())
}

// 103 Early Hints before the answer are passed on, not taken for it.
func TestEarlyHintsAreNotTheResponse(t *testing.T) {
	var runs atomic.Int32
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.Header().Set("Link", "</a.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "made")
	}), idemhttp.Options{Unscoped: true})
	first, b1 := post(t, srv.Client(), srv.URL, "k", "{}")
	replay, b2 := post(t, srv.Client(), srv.URL, "k", "{}")
	assert.Equal(t, http.StatusCreated, first.StatusCode)
	assert.Equal(t, first.StatusCode, replay.StatusCode)
	assert.Equal(t, b1, b2)
	assert.Equal(t, int32(1), runs.Load())
}

// An invalid status code makes net/http panic in WriteHeader before
// anything is sent: the client gets the middleware's 500, not a cut
// connection.
func TestInvalidStatusGetsA500(t *testing.T) {
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(1000)
	}), idemhttp.Options{Unscoped: true, Logger: quiet()})
	req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("{}"))
	req.Header.Set(idemhttp.Header, "k")
	resp, err := srv.Client().Do(req)
	require.NoError(t, err, "nothing was sent: the client should get the middleware's 500")
	resp.Body.Close()
	assert.Equal(t, http.StatusInternalServerError, resp.StatusCode)
}

// A handler that relays an upstream body under the upstream's
// Content-Length, and whose copy breaks half way, returns having written
// 50 of 100 declared bytes: the first client is told its body is short,
// and the retry's replay says the body is truncated, never passing the 50
// bytes off as the whole answer.
func TestShortContentLengthIsReplayedAsTruncated(t *testing.T) {
	var runs atomic.Int32
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", "100")
		w.WriteHeader(http.StatusOK)
		io.WriteString(w, strings.Repeat("a", 50)) // then the upstream read fails
	}), idemhttp.Options{Unscoped: true, Logger: quiet()})
	req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("{}"))
	req.Header.Set(idemhttp.Header, "k")
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	_, err = io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Error(t, err, "the first client is told its body is short")

	retry, body := post(t, srv.Client(), srv.URL, "k", "{}")
	assert.Equal(t, int32(1), runs.Load())
	assert.Equal(t, http.StatusOK, retry.StatusCode)
	assert.Equal(t, "truncated", retry.Header.Get(idemhttp.BodyOmittedHeader))
	assert.Empty(t, body)
}

// A handler that writes past its Content-Length is told so
// (http.ErrContentLength), as net/http tells it, and the replay is what
// the first client got.
func TestWritePastContentLengthIsToldTheHandler(t *testing.T) {
	var werr error
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "5")
		_, werr = io.WriteString(w, "0123456789")
	}), idemhttp.Options{Unscoped: true, Logger: quiet()})
	req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("{}"))
	req.Header.Set(idemhttp.Header, "k")
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	b1, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	_, b2 := post(t, srv.Client(), srv.URL, "k", "{}")
	assert.ErrorIs(t, werr, http.ErrContentLength, "the handler is not told its write was refused")
	assert.Equal(t, string(b1), b2, "the replay is not what the first client got")
}

// Headers an outer middleware sets on every response before the guard
// runs (a per-session CSRF token, CORS reflecting the caller's Origin)
// are not the handler's: a replay carries the retry's own fresh values.
func TestOuterMiddlewareHeadersAreNotReplayed(t *testing.T) {
	guarded := idemhttp.Middleware(newStore(t, idem.Options{}), idemhttp.Options{
		Logger: quiet(),
		Scope:  func(r *http.Request) (string, error) { return "acct-1", nil },
	})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"charge":1}`)
	}))
	outer := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Csrf-Token", "token-of-"+r.Header.Get("X-Session"))
		w.Header().Set("Access-Control-Allow-Origin", r.Header.Get("Origin"))
		guarded.ServeHTTP(w, r)
	})
	srv := httptest.NewServer(outer)
	t.Cleanup(srv.Close)
	send := func(session, origin string) *http.Response {
		req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("{}"))
		req.Header.Set(idemhttp.Header, "k")
		req.Header.Set("X-Session", session)
		req.Header.Set("Origin", origin)
		resp, err := srv.Client().Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp
	}
	send("phone", "https://app.example")
	retry := send("laptop", "https://admin.example")
	require.Equal(t, "true", retry.Header.Get(idemhttp.ReplayedHeader))
	assert.Equal(t, "token-of-laptop", retry.Header.Get("X-Csrf-Token"), "another session's token replayed")
	assert.Equal(t, "https://admin.example", retry.Header.Get("Access-Control-Allow-Origin"))
}
