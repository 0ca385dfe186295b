package idemhttp_test

import (
	"bufio"
	"io"
	"log/slog"
	"net"
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

func rvQuiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// A handler that tries to hijack (a WebSocket-or-fallback endpoint, any
// handler under HTTP/2) and, refused, answers normally: nothing was
// streamed, yet the replay drops the body and says "streamed".
func TestReviewFailedHijackDropsBody(t *testing.T) {
	var runs atomic.Int32
	h := idemhttp.Middleware(newStore(t, idem.Options{}), idemhttp.Options{Unscoped: true, Logger: rvQuiet()})(
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

// noFlush is an outer middleware's writer that does not flush (and has no
// Unwrap): Flush through the recorder does nothing, yet marks the
// response streamed.
type noFlush struct{ w http.ResponseWriter }

func (n noFlush) Header() http.Header         { return n.w.Header() }
func (n noFlush) Write(p []byte) (int, error) { return n.w.Write(p) }
func (n noFlush) WriteHeader(c int)           { n.w.WriteHeader(c) }

func TestReviewFlushThatCannotFlushDropsBody(t *testing.T) {
	mw := idemhttp.Middleware(newStore(t, idem.Options{}), idemhttp.Options{Unscoped: true, Logger: rvQuiet()})
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
	t.Logf("Flush error seen by the handler: %v", flushErr)
	assert.Error(t, flushErr, "the handler is told a flush happened that did not")
	assert.Equal(t, first.Body.String(), replay.Body.String())
}

// A handler that calls ReleaseKey (it failed) and then writes its own 4xx
// anyway: the key is not released, and the 4xx is remembered without its
// body, labelled "too-large" though it is 20 bytes.
func TestReviewReleaseKeyThenWrite(t *testing.T) {
	var runs atomic.Int32
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		idemhttp.ReleaseKey(w)
		w.WriteHeader(http.StatusBadRequest)
		io.WriteString(w, `{"error":"bad card"}`)
	}), idemhttp.Options{Unscoped: true, Logger: rvQuiet()})
	first, b1 := post(t, srv.Client(), srv.URL, "k", "{}")
	replay, b2 := post(t, srv.Client(), srv.URL, "k", "{}")
	t.Logf("first %d %q; replay %d %q omitted=%q runs=%d", first.StatusCode, b1, replay.StatusCode, b2, replay.Header.Get(idemhttp.BodyOmittedHeader), runs.Load())
	if replay.Header.Get(idemhttp.ReplayedHeader) == "true" {
		assert.Equal(t, b1, b2, "a replay of a 20-byte body says too-large")
	}
}

// A declared trailer whose name was also set as a header before
// WriteHeader: net/http sends it as a header too (and as the trailer).
func TestReviewDeclaredTrailerAlsoHeader(t *testing.T) {
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Trailer", "X-Sum")
		w.Header().Set("X-Sum", "pending")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "x")
		w.Header().Set("X-Sum", "abc")
	}), idemhttp.Options{Unscoped: true})
	first, _ := post(t, srv.Client(), srv.URL, "k", "{}")
	replay, _ := post(t, srv.Client(), srv.URL, "k", "{}")
	t.Logf("first header %v trailer %v; replay header %v trailer %v", first.Header, first.Trailer, replay.Header, replay.Trailer)
	assert.Equal(t, first.Header.Get("X-Sum"), replay.Header.Get("X-Sum"))
	assert.Equal(t, first.Trailer.Get("X-Sum"), replay.Trailer.Get("X-Sum"))
}

// 103 Early Hints then the answer.
func TestReviewEarlyHints(t *testing.T) {
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
	assert.Equal(t, first.StatusCode, replay.StatusCode)
	assert.Equal(t, b1, b2)
	assert.Equal(t, int32(1), runs.Load())
}

// An invalid status code makes net/http panic in WriteHeader: the
// recorder has already taken it for the status, so the panic is treated
// as "part of a response is out" and the connection is aborted instead of
// a 500 answered.
func TestReviewInvalidStatusIsAbortNot500(t *testing.T) {
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(1000)
	}), idemhttp.Options{Unscoped: true, Logger: rvQuiet()})
	req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("{}"))
	req.Header.Set(idemhttp.Header, "k")
	resp, err := srv.Client().Do(req)
	if err == nil {
		resp.Body.Close()
		t.Logf("status %d", resp.StatusCode)
	}
	assert.NoError(t, err, "nothing was sent: the client should get the middleware's 500")
}

// Hijack then the raw conn; a second Hijack attempt etc. kept for ref.
var _ = bufio.NewReader
var _ net.Conn

// A handler that relays an upstream body under the upstream's
// Content-Length, and whose copy breaks half way (the upstream died),
// returns having written 50 of 100 declared bytes. net/http cuts the
// connection, so the first client sees an error (and Transport retries);
// the retry is a replay of the 50 bytes, sent with a fresh Content-Length
// of 50 and no mark: a truncated body passed off as the whole answer.
func TestReviewShortContentLengthReplaysSilentPrefix(t *testing.T) {
	var runs atomic.Int32
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", "100")
		w.WriteHeader(http.StatusOK)
		io.WriteString(w, strings.Repeat("a", 50)) // then the upstream read fails
	}), idemhttp.Options{Unscoped: true, Logger: rvQuiet()})
	req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("{}"))
	req.Header.Set(idemhttp.Header, "k")
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	_, err = io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Error(t, err, "the first client is told its body is short")

	retry, body := post(t, srv.Client(), srv.URL, "k", "{}")
	assert.Equal(t, int32(1), runs.Load())
	t.Logf("replay: %d, %d bytes, Content-Length %q, omitted %q", retry.StatusCode, len(body), retry.Header.Get("Content-Length"), retry.Header.Get(idemhttp.BodyOmittedHeader))
	if retry.Header.Get(idemhttp.BodyOmittedHeader) == "" {
		assert.Len(t, body, 100, "a silent prefix: 50 of 100 bytes replayed as the whole body")
	}
}

// The other way: a handler that writes past its Content-Length is told
// (http.ErrContentLength) by net/http; under the guard the error is
// swallowed as if the client had hung up, and the excess is remembered.
func TestReviewLongContentLength(t *testing.T) {
	var werr error
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "5")
		_, werr = io.WriteString(w, "0123456789")
	}), idemhttp.Options{Unscoped: true, Logger: rvQuiet()})
	req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("{}"))
	req.Header.Set(idemhttp.Header, "k")
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	b1, rerr := io.ReadAll(resp.Body)
	resp.Body.Close()
	_, b2 := post(t, srv.Client(), srv.URL, "k", "{}")
	t.Logf("handler's write error %v; first %q (read error %v), replay %q", werr, b1, rerr, b2)
	assert.ErrorIs(t, werr, http.ErrContentLength, "the handler is not told its write was refused")
	assert.Equal(t, string(b1), b2, "the replay is not what the first client got")
}

// Headers an outer middleware sets on every response (before the guard
// runs: a per-session CSRF token, CORS reflecting the caller's Origin, a
// request id) are recorded as if the handler had set them, and a replay
// overwrites the retry's own fresh values with the first request's: the
// retry from the same account's other session gets the first session's
// token, and a browser on the second origin is refused by CORS.
func TestReviewOuterMiddlewareHeadersReplayedOverFreshOnes(t *testing.T) {
	guarded := idemhttp.Middleware(newStore(t, idem.Options{}), idemhttp.Options{
		Logger: rvQuiet(),
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

// The same over a real HTTP/2 server, where Hijack always fails: a handler
// that tries it (a WebSocket-or-plain endpoint) and falls back to a plain
// 201 has that 201 replayed without its body, marked "streamed".
func TestReviewFailedHijackOverHTTP2(t *testing.T) {
	var runs atomic.Int32
	h := idemhttp.Middleware(newStore(t, idem.Options{}), idemhttp.Options{Unscoped: true, Logger: rvQuiet()})(
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

// Keys that differ only by surrounding white space: WithKey sends them
// bare, the server's header parsing trims them, and two logical
// operations share one key (the second is 422, or worse, a replay).
func TestReviewWhitespaceKeysCollide(t *testing.T) {
	srv := serve(t, &charges{}, idemhttp.Options{Unscoped: true})
	client := &http.Client{Transport: &idemhttp.Transport{Base: srv.Client().Transport}}
	send := func(key, body string) int {
		req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(body))
		resp, err := client.Do(idemhttp.WithKey(req, key))
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	require.NoError(t, idem.CheckKey("order-7 "))
	assert.Equal(t, http.StatusCreated, send("order-7", `{"a":1}`))
	assert.Equal(t, http.StatusCreated, send("order-7 ", `{"a":2}`), "a different key, refused as the same")
}
