package idemhttp_test

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemhttp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A handler that set its headers then panicked before writing: the 500
// carries none of them (a Content-Encoding: gzip around a plain
// problem+json body, a Location or a cookie of a charge that failed).
func TestPanicDropsTheHandlersHeadersFromThe500(t *testing.T) {
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Encoding", "gzip")
		w.Header().Set("Location", "/charges/1")
		w.Header().Set("Set-Cookie", "session=half-made")
		panic("boom")
	}), idemhttp.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("{}"))
	req.Header.Set(idemhttp.Header, "k")
	req.Header.Set("Accept-Encoding", "identity")
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	assert.Equal(t, http.StatusInternalServerError, resp.StatusCode)
	assert.Contains(t, resp.Header.Get("Content-Type"), "application/problem+json", "%q", body)
	assert.Empty(t, resp.Header.Get("Content-Encoding"), "a plain JSON problem body labelled gzip")
	assert.Empty(t, resp.Header.Get("Location"), "a Location of a charge that failed")
	assert.Empty(t, resp.Header.Get("Set-Cookie"))
}

// A WriteError that panics strands no key, whatever the path: after a
// handler's panic, and on a 422.
func TestWriteErrorThatPanicsStrandsNoKey(t *testing.T) {
	var runs atomic.Int32
	var boom atomic.Bool
	boom.Store(true)
	opts := idemhttp.Options{
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		WriteError: func(w http.ResponseWriter, r *http.Request, p idemhttp.Problem) {
			if boom.Load() {
				panic("writer exploded")
			}
			idemhttp.WriteProblem(w, r, p)
		},
	}
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			panic("handler exploded")
		}
		w.WriteHeader(http.StatusCreated)
	}), opts)
	// handler panic -> fail -> WriteError panics -> connection aborted.
	req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("{}"))
	req.Header.Set(idemhttp.Header, "k")
	_, err := srv.Client().Do(req)
	assert.Error(t, err, "the connection is aborted")
	boom.Store(false)
	retry, _ := post(t, srv.Client(), srv.URL, "k", "{}")
	assert.Equal(t, http.StatusCreated, retry.StatusCode)
	// 422 path with a panicking writer, then a normal replay.
	boom.Store(true)
	req, _ = http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("other"))
	req.Header.Set(idemhttp.Header, "k")
	_, err = srv.Client().Do(req)
	assert.Error(t, err, "the connection is aborted")
	boom.Store(false)
	again, _ := post(t, srv.Client(), srv.URL, "k", "{}")
	assert.Equal(t, http.StatusCreated, again.StatusCode)
	assert.Equal(t, int32(2), runs.Load())
}

// Huge and malformed keys are 400 (or 431, too large a header for the
// server) and run nothing; a key at the bound still keeps scopes apart.
func TestMalformedKeysAreRefused(t *testing.T) {
	var runs atomic.Int32
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { runs.Add(1) }), idemhttp.Options{})
	for _, k := range []string{strings.Repeat("a", 256), strings.Repeat("a", 60000), `"abc`, `"a\b"`, `"a"b"`, `""`, `"k";p=1`, `"a\u00e9"`} {
		resp, _ := post(t, srv.Client(), srv.URL, k, "{}")
		assert.Contains(t, []int{400, 431}, resp.StatusCode, "key %.20q", k)
	}
	// A control character, straight to the handler (clients refuse to send it).
	h := idemhttp.Middleware(newStore(t, idem.Options{}), idemhttp.Options{})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { runs.Add(1) }))
	rr := httptest.NewRecorder()
	rq := httptest.NewRequest(http.MethodPost, "/", strings.NewReader("{}"))
	rq.Header.Set(idemhttp.Header, "a\x7fb")
	h.ServeHTTP(rr, rq)
	assert.Equal(t, 400, rr.Code)
	// A scoped key near the bound must still separate scopes.
	srv2 := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, r.Header.Get("X-Acct"))
	}), idemhttp.Options{Scope: func(r *http.Request) (string, error) { return r.Header.Get("X-Acct"), nil }})
	k := strings.Repeat("k", 255)
	for _, acct := range []string{"alice", "bob"} {
		req, _ := http.NewRequest(http.MethodPost, srv2.URL, strings.NewReader("{}"))
		req.Header.Set(idemhttp.Header, k)
		req.Header.Set("X-Acct", acct)
		resp, err := srv2.Client().Do(req)
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		assert.Equal(t, acct, string(b))
	}
	assert.Zero(t, runs.Load())
}

// A Scope error is one a client can cause at will (no credentials): it is
// never logged at Error, so no client can flood the log.
func TestScopeErrorsAreNotLoggedAsErrors(t *testing.T) {
	var buf bytes.Buffer
	var mu sync.Mutex
	logger := slog.New(slog.NewTextHandler(lockedWriter{&mu, &buf}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}), idemhttp.Options{
		Logger: logger,
		Scope:  func(r *http.Request) (string, error) { return "", errors.New("no credentials") },
	})
	for range 5 {
		post(t, srv.Client(), srv.URL, "k", "{}")
	}
	mu.Lock()
	defer mu.Unlock()
	assert.Zero(t, strings.Count(buf.String(), "level=ERROR"), "a client without credentials floods the log: %s", buf.String())
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
