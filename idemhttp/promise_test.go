package idemhttp_test

import (
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
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

// A handler that returned a remembered status has taken effect: if its body
// could not be kept (streamed, or too large), the outcome is remembered
// without it, and a retry is told the status and that the body is missing.
// It never runs the handler again.
func TestFinishedResponseIsNeverReleased(t *testing.T) {
	for _, tc := range []struct {
		name    string
		handler http.HandlerFunc
		opts    idemhttp.Options
	}{
		{"streamed", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Location", "/charges/1")
			w.Header().Set("Content-Type", "text/plain")
			w.WriteHeader(http.StatusCreated)
			w.Write([]byte("part 1"))
			http.NewResponseController(w).Flush()
			w.Write([]byte("part 2"))
		}, idemhttp.Options{}},
		{"too-large", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Location", "/charges/1")
			w.Header().Set("Content-Type", "text/plain")
			w.WriteHeader(http.StatusCreated)
			w.Write([]byte(strings.Repeat("x", 2048)))
		}, idemhttp.Options{MaxStoredBody: 1024}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var runs atomic.Int32
			srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs.Add(1)
				tc.handler(w, r)
			}), tc.opts)
			first, body := post(t, srv.Client(), srv.URL, "k", "{}")
			assert.Equal(t, http.StatusCreated, first.StatusCode)
			assert.NotEmpty(t, body, "the first client gets the whole body")

			retry, replayed := post(t, srv.Client(), srv.URL, "k", "{}")
			assert.Equal(t, int32(1), runs.Load(), "the handler finished: it never runs again")
			assert.Equal(t, http.StatusCreated, retry.StatusCode, "the retry is told the original status")
			assert.Equal(t, "true", retry.Header.Get(idemhttp.ReplayedHeader))
			assert.Equal(t, tc.name, retry.Header.Get(idemhttp.BodyOmittedHeader))
			assert.Equal(t, "/charges/1", retry.Header.Get("Location"), "where to fetch the result")
			assert.Empty(t, retry.Header.Get("Content-Type"), "no header describes a body that is not there")
			assert.Empty(t, replayed)
		})
	}
}

// When the backend cannot record the outcome, the store keeps it in memory:
// retries replay it, not 503, and once the backend is back the outcome is
// recorded there for every instance.
func TestUnrecordedOutcomeIsReplayedAndSettledLater(t *testing.T) {
	mem := idemtest.NewMemoryBackend()
	var down atomic.Bool
	down.Store(true)
	flaky := idemtest.Faulty{Backend: mem, Fail: func(op string) error {
		if op == "Complete" && down.Load() {
			return errors.New("disk full")
		}
		return nil
	}}
	store := newStore(t, idem.Options{Backend: flaky, SettleTimeout: 20 * time.Millisecond})
	h := &charges{}
	srv := httptest.NewServer(idemhttp.Middleware(store, idemhttp.Options{})(h))
	defer srv.Close()

	first, body := post(t, srv.Client(), srv.URL, "k", "{}")
	require.Equal(t, http.StatusCreated, first.StatusCode)
	retry, replayed := post(t, srv.Client(), srv.URL, "k", "{}")
	assert.Equal(t, http.StatusCreated, retry.StatusCode, "an outcome held in memory replays, not 503")
	assert.Equal(t, body, replayed)
	assert.Equal(t, "true", retry.Header.Get(idemhttp.ReplayedHeader))

	down.Store(false)
	deadline := time.Now().Add(10 * time.Second)
	for {
		rec, ok, err := mem.Get(context.Background(), idemhttp.StoreKey("", "k"), time.Now())
		require.NoError(t, err)
		if ok && rec.State.String() == "completed" {
			break
		}
		require.True(t, time.Now().Before(deadline), "the outcome was never recorded once the backend came back")
		time.Sleep(5 * time.Millisecond) // polls for a state; orders nothing
	}
	other := httptest.NewServer(idemhttp.Middleware(newStore(t, idem.Options{Backend: mem}), idemhttp.Options{})(h))
	defer other.Close()
	again, replayed := post(t, other.Client(), other.URL, "k", "{}")
	assert.Equal(t, http.StatusCreated, again.StatusCode, "another instance replays it from the backend")
	assert.Equal(t, body, replayed)
	assert.Equal(t, int32(1), h.n.Load())
}

// gzipped compresses its handler's response, as compression middleware
// inside the guard does.
func gzipped(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Encoding", "gzip")
		w.Header().Add("Vary", "Accept-Encoding")
		zw := gzip.NewWriter(w)
		next.ServeHTTP(gzipWriter{w, zw}, r)
		zw.Close()
	})
}

type gzipWriter struct {
	http.ResponseWriter
	zw *gzip.Writer
}

func (g gzipWriter) Write(p []byte) (int, error) { return g.zw.Write(p) }

// A replay carries the representation headers the handler set: a gzip
// response comes back as gzip the client can decode.
func TestReplayKeepsRepresentationHeaders(t *testing.T) {
	h := &charges{}
	inner := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Disposition", `attachment; filename="receipt.json"`)
		w.Header().Set("Content-Language", "en")
		h.ServeHTTP(w, r)
	})
	srv := serve(t, gzipped(inner), idemhttp.Options{})
	first, body := post(t, srv.Client(), srv.URL, "k", "{}")
	require.True(t, first.Uncompressed, "the client decoded the first response")
	retry, replayed := post(t, srv.Client(), srv.URL, "k", "{}")
	assert.Equal(t, "true", retry.Header.Get(idemhttp.ReplayedHeader))
	assert.True(t, retry.Uncompressed, "the replay says it is gzip, so the client decodes it")
	assert.Equal(t, body, replayed)
	assert.Contains(t, replayed, `"charge":1`)
	assert.Equal(t, `attachment; filename="receipt.json"`, retry.Header.Get("Content-Disposition"))
	assert.Equal(t, "en", retry.Header.Get("Content-Language"))
	assert.Empty(t, retry.Header.Get("Set-Cookie"))

	// An allow list and a deny list still choose.
	only := serve(t, gzipped(inner), idemhttp.Options{StoredHeaders: []string{"Content-Encoding", "Content-Type"}, SkipHeaders: []string{"Content-Type"}})
	post(t, only.Client(), only.URL, "k", "{}")
	retry, replayed = post(t, only.Client(), only.URL, "k", "{}")
	assert.True(t, retry.Uncompressed)
	assert.Contains(t, replayed, `"charge"`)
	assert.Empty(t, retry.Header.Get("Content-Type"), "skipped")
	assert.Empty(t, retry.Header.Get("Content-Disposition"), "not on the allow list")
}

// Wait bounds a duplicate whose key is in flight on another instance.
func TestWaitBoundsADuplicateOnAnotherInstance(t *testing.T) {
	mem := idemtest.NewMemoryBackend()
	started, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	h := &charges{}
	slow := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		once.Do(func() { close(started) })
		<-release
		h.ServeHTTP(w, r)
	})
	opts := idemhttp.Options{Wait: 100 * time.Millisecond}
	a := httptest.NewServer(idemhttp.Middleware(newStore(t, idem.Options{Backend: mem}), opts)(slow))
	defer a.Close()
	b := httptest.NewServer(idemhttp.Middleware(newStore(t, idem.Options{Backend: mem}), opts)(slow))
	defer b.Close()

	firstDone := make(chan string, 1)
	go func() {
		_, body := post(t, a.Client(), a.URL, "k", "{}")
		firstDone <- body
	}()
	<-started
	start := time.Now()
	dup, _ := post(t, b.Client(), b.URL, "k", "{}")
	took := time.Since(start)
	assert.Equal(t, http.StatusConflict, dup.StatusCode, "in flight on instance A")
	assert.Equal(t, "1", dup.Header.Get("Retry-After"))
	assert.Less(t, took, 5*time.Second, "instance B held the duplicate past its Wait")
	close(release)
	body := <-firstDone
	retry, replayed := post(t, b.Client(), b.URL, "k", "{}")
	assert.Equal(t, http.StatusCreated, retry.StatusCode)
	assert.Equal(t, body, replayed)
	assert.Equal(t, int32(1), h.n.Load())
}

// levels records the level of every log record.
type levels struct {
	mu   sync.Mutex
	seen []slog.Level
}

func (l *levels) Enabled(context.Context, slog.Level) bool { return true }
func (l *levels) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.seen = append(l.seen, r.Level)
	return nil
}
func (l *levels) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *levels) WithGroup(string) slog.Handler      { return l }

func (l *levels) max() slog.Level {
	l.mu.Lock()
	defer l.mu.Unlock()
	m := slog.LevelDebug
	for _, v := range l.seen {
		m = max(m, v)
	}
	return m
}

// A full store says so with 503 and Retry-After, and a client that fills it
// on purpose cannot flood the log at Error.
func TestFullStoreRefusalIsQuiet(t *testing.T) {
	started, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	h := &charges{}
	log := &levels{}
	srv := httptest.NewServer(idemhttp.Middleware(newStore(t, idem.Options{MaxKeys: 1}), idemhttp.Options{Unscoped: true, Logger: slog.New(log)})(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			once.Do(func() { close(started) })
			<-release
			h.ServeHTTP(w, r)
		})))
	defer srv.Close()
	done := make(chan struct{})
	go func() {
		post(t, srv.Client(), srv.URL, "holds-the-only-slot", "{}")
		close(done)
	}()
	<-started
	for i := range 20 {
		resp, body := post(t, srv.Client(), srv.URL, fmt.Sprintf("k%d", i), "{}")
		assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
		assert.Equal(t, "1", resp.Header.Get("Retry-After"))
		assert.Contains(t, body, "as many requests in flight as it can track")
	}
	close(release)
	<-done
	assert.Less(t, log.max(), slog.LevelWarn, "a refusal a client can cause is logged below Warn")
}

// A service answers refusals in its own error format.
func TestWriteErrorAnswersInTheServicesFormat(t *testing.T) {
	var got []idemhttp.Problem
	var mu sync.Mutex
	opts := idemhttp.Options{WriteError: func(w http.ResponseWriter, r *http.Request, p idemhttp.Problem) {
		mu.Lock()
		got = append(got, p)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/vnd.acme.error+json")
		w.WriteHeader(p.Status)
		json.NewEncoder(w).Encode(map[string]any{"code": p.Status, "message": p.Detail})
	}}
	srv := serve(t, &charges{}, opts)
	post(t, srv.Client(), srv.URL, "k", `{"order":1}`)
	resp, body := post(t, srv.Client(), srv.URL, "k", `{"order":2}`)
	assert.Equal(t, http.StatusUnprocessableEntity, resp.StatusCode)
	assert.Equal(t, "application/vnd.acme.error+json", resp.Header.Get("Content-Type"))
	assert.Contains(t, body, `"code":422`)
	resp, _ = post(t, srv.Client(), srv.URL, strings.Repeat("k", 300), `{}`)
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)

	mu.Lock()
	defer mu.Unlock()
	require.Len(t, got, 2)
	assert.ErrorIs(t, got[0].Err, idem.ErrPayloadMismatch, "the writer gets the cause")
	assert.Equal(t, http.StatusBadRequest, got[1].Status)
}

// recordLog keeps every log record's attributes.
type recordLog struct {
	mu    sync.Mutex
	attrs []map[string]string
}

func (l *recordLog) Enabled(context.Context, slog.Level) bool { return true }
func (l *recordLog) Handle(_ context.Context, r slog.Record) error {
	m := map[string]string{}
	r.Attrs(func(a slog.Attr) bool { m[a.Key] = a.Value.String(); return true })
	l.mu.Lock()
	l.attrs = append(l.attrs, m)
	l.mu.Unlock()
	return nil
}
func (l *recordLog) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *recordLog) WithGroup(string) slog.Handler      { return l }

// Log lines name the request's key, or its hash, and its scope.
func TestLogLinesCarryKeyAndScope(t *testing.T) {
	panicky := http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("handler bug") })
	for _, hash := range []bool{false, true} {
		log := &recordLog{}
		opts := idemhttp.Options{
			Logger:         slog.New(log),
			HashKeysInLogs: hash,
			Scope:          func(r *http.Request) (string, error) { return "acct-alice", nil },
		}
		srv := serve(t, panicky, opts)
		post(t, srv.Client(), srv.URL, "order-101", "{}")
		log.mu.Lock()
		require.NotEmpty(t, log.attrs)
		line := log.attrs[0]
		log.mu.Unlock()
		assert.Equal(t, "acct-alice", line["scope"])
		if hash {
			assert.Empty(t, line["key"], "the key itself is not logged")
			assert.Len(t, line["key_sha256"], 64)
		} else {
			assert.Equal(t, "order-101", line["key"])
		}
	}
}
