package idemhttp_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemhttp"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A handler (or a library under it) that writes header names into the map
// in lower case: net/http sends them as they are, and the deny list, which
// only knows canonical names, stores and replays them.
func TestHostileLowercaseCredentialsReplayed(t *testing.T) {
	var runs atomic.Int32
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.Header()["set-cookie"] = []string{"session=secret-of-first-response"}
		w.Header()["www-authenticate"] = []string{`Bearer realm="x"`}
		w.Header()["x-request-id"] = []string{"req-1"}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "ok")
	}), idemhttp.Options{SkipHeaders: []string{"X-Request-Id"}})
	first, _ := post(t, srv.Client(), srv.URL, "k", "{}")
	require.Equal(t, http.StatusCreated, first.StatusCode)
	retry, _ := post(t, srv.Client(), srv.URL, "k", "{}")
	assert.Equal(t, "true", retry.Header.Get(idemhttp.ReplayedHeader))
	assert.Empty(t, retry.Header.Values("Set-Cookie"), "Set-Cookie must never be replayed")
	assert.Empty(t, retry.Header.Values("Www-Authenticate"), "WWW-Authenticate must never be replayed")
	assert.Empty(t, retry.Header.Values("X-Request-Id"), "SkipHeaders must never be replayed")
}

// A handler that flushes its headers and writes no body has answered 200
// (net/http sent it), but the recorder saw no status: the key is released
// and the retry runs the handler again.
func TestHostileFlushOnlyRunsTwice(t *testing.T) {
	var runs atomic.Int32
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.Header().Set("Location", "/charges/1")
		http.NewResponseController(w).Flush()
	}), idemhttp.Options{})
	first, _ := post(t, srv.Client(), srv.URL, "k", "{}")
	require.Equal(t, http.StatusOK, first.StatusCode)
	retry, _ := post(t, srv.Client(), srv.URL, "k", "{}")
	assert.Equal(t, int32(1), runs.Load(), "the handler finished with 200: it must never run again")
	assert.Equal(t, http.StatusOK, retry.StatusCode)
}

// Flush before WriteHeader sends 200; the recorder then records the later
// WriteHeader's status, which the client never saw.
func TestHostileFlushThenWriteHeaderReplaysOtherStatus(t *testing.T) {
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.NewResponseController(w).Flush()
		w.WriteHeader(http.StatusAccepted)
		io.WriteString(w, "queued")
	}), idemhttp.Options{})
	first, _ := post(t, srv.Client(), srv.URL, "k", "{}")
	retry, _ := post(t, srv.Client(), srv.URL, "k", "{}")
	assert.Equal(t, first.StatusCode, retry.StatusCode, "a replay tells the status the client got")
}

// With a Backend, Response goes through encoding/json: header values with
// obs-text bytes (legal in HTTP) come back as U+FFFD.
func TestHostileNonUTF8HeaderMangledByBackend(t *testing.T) {
	store := newStore(t, idem.Options{Backend: idemtest.NewMemoryBackend()})
	val := "attachment; filename=\"r\xe9sum\xe9.pdf\"" // Latin-1
	srv := httptest.NewServer(idemhttp.Middleware(store, idemhttp.Options{})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Disposition", val)
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "x")
	})))
	defer srv.Close()
	first, _ := post(t, srv.Client(), srv.URL, "k", "{}")
	require.Equal(t, val, first.Header.Get("Content-Disposition"))
	retry, _ := post(t, srv.Client(), srv.URL, "k", "{}")
	require.Equal(t, "true", retry.Header.Get(idemhttp.ReplayedHeader))
	assert.Equal(t, []byte(val), []byte(retry.Header.Get("Content-Disposition")), "replayed header bytes differ")
}

// A handler that set its headers then panicked before writing: the 500
// carries the handler's headers (Content-Encoding: gzip, Location, cookie)
// around a plain problem+json body.
func TestHostilePanicLeavesHandlerHeadersOn500(t *testing.T) {
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
	t.Logf("500 headers: %v body: %q", resp.Header, body)
	assert.Empty(t, resp.Header.Get("Content-Encoding"), "a plain JSON problem body labelled gzip")
	assert.Empty(t, resp.Header.Get("Location"), "a Location of a charge that failed")
	assert.Empty(t, resp.Header.Get("Set-Cookie"))
}

// WriteError that panics must not strand a key, whatever the path.
func TestHostileWriteErrorPanicsNoStrand(t *testing.T) {
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
	t.Logf("first call: %v", err)
	boom.Store(false)
	retry, _ := post(t, srv.Client(), srv.URL, "k", "{}")
	assert.Equal(t, http.StatusCreated, retry.StatusCode)
	// 422 path with a panicking writer, then a normal replay.
	boom.Store(true)
	req, _ = http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("other"))
	req.Header.Set(idemhttp.Header, "k")
	_, err = srv.Client().Do(req)
	t.Logf("422 call: %v", err)
	boom.Store(false)
	again, _ := post(t, srv.Client(), srv.URL, "k", "{}")
	assert.Equal(t, http.StatusCreated, again.StatusCode)
	assert.Equal(t, int32(2), runs.Load())
}

// Huge and malformed keys.
func TestHostileMalformedKeys(t *testing.T) {
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

// Many duplicates of a streamed response: one run; all answered.
func TestHostileConcurrentStreamed(t *testing.T) {
	var runs atomic.Int32
	gate := make(chan struct{})
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "a")
		http.NewResponseController(w).Flush()
		<-gate
		io.WriteString(w, "b")
	}), idemhttp.Options{MaxWaiters: 19})
	var wg sync.WaitGroup
	codes := make(chan int, 20)
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("{}"))
			req.Header.Set(idemhttp.Header, "k")
			resp, err := srv.Client().Do(req)
			if err != nil {
				codes <- -1
				return
			}
			io.ReadAll(resp.Body)
			resp.Body.Close()
			codes <- resp.StatusCode
		}()
	}
	for runs.Load() == 0 {
		yield()
	}
	time.Sleep(50 * time.Millisecond) // lets duplicates queue; orders nothing the test checks
	close(gate)
	wg.Wait()
	close(codes)
	for c := range codes {
		assert.Equal(t, http.StatusCreated, c)
	}
	assert.Equal(t, int32(1), runs.Load())
}

// Scope errors are client-causable (no credentials): each logs at Error.
func TestHostileScopeErrorLogLevel(t *testing.T) {
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

var _ = context.Background
