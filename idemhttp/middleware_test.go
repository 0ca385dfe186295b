package idemhttp_test

import (
	"context"
	"errors"
	"fmt"
	"io"
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

func TestRetryReplaysResponse(t *testing.T) {
	h := &charges{}
	srv := serve(t, h, idemhttp.Options{})
	first, body := post(t, srv.Client(), srv.URL+"/charges", "k-1", `{"order":101}`)
	require.Equal(t, http.StatusCreated, first.StatusCode)
	assert.Empty(t, first.Header.Get(idemhttp.ReplayedHeader))
	assert.Equal(t, "session=secret", first.Header.Get("Set-Cookie"), "the first response is the handler's own")

	retry, replayed := post(t, srv.Client(), srv.URL+"/charges", "k-1", `{"order":101}`)
	assert.Equal(t, http.StatusCreated, retry.StatusCode)
	assert.Equal(t, body, replayed)
	assert.Equal(t, "true", retry.Header.Get(idemhttp.ReplayedHeader))
	assert.Equal(t, "application/json", retry.Header.Get("Content-Type"))
	assert.Equal(t, "/charges/1", retry.Header.Get("Location"))
	assert.Empty(t, retry.Header.Get("Set-Cookie"), "Set-Cookie is never replayed")
	assert.Equal(t, "replayed too", retry.Header.Get("X-Custom"), "end-to-end headers the handler set are replayed")
	assert.Equal(t, int32(1), h.n.Load())

	get, err := srv.Client().Get(srv.URL + "/charges")
	require.NoError(t, err)
	get.Body.Close()
	assert.Equal(t, int32(2), h.n.Load(), "GET is not guarded")
}

// gate is an outer middleware that counts requests as they arrive and
// responses by status, so a test can hold the handler until the others are
// where it wants them.
type gate struct {
	arrived  atomic.Int32
	statuses sync.Map // status -> *atomic.Int32
	next     http.Handler
}

func (g *gate) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	g.arrived.Add(1)
	sw := &statusWriter{ResponseWriter: w}
	g.next.ServeHTTP(sw, r)
	n, _ := g.statuses.LoadOrStore(sw.status, new(atomic.Int32))
	n.(*atomic.Int32).Add(1)
}

func (g *gate) count(status int) int32 {
	n, ok := g.statuses.Load(status)
	if !ok {
		return 0
	}
	return n.(*atomic.Int32).Load()
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(p)
}

func TestConcurrentRequestsOneKey(t *testing.T) {
	const requests = 200
	for _, tc := range []struct {
		name string
		wait time.Duration
	}{
		{"wait bound: all replay", time.Minute},
		{"short bound: 409", time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := &charges{}
			g := &gate{}
			release := make(chan struct{})
			slow := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				<-release
				h.ServeHTTP(w, r)
			})
			g.next = idemhttp.Middleware(newStore(t, idem.Options{}), idemhttp.Options{Wait: tc.wait, MaxWaiters: -1})(slow)
			srv := httptest.NewServer(g)
			defer srv.Close()
			client := &http.Client{Transport: &http.Transport{MaxConnsPerHost: 0, MaxIdleConnsPerHost: requests}}
			defer client.CloseIdleConnections()

			type result struct {
				status   int
				body     string
				replayed string
				retry    string
			}
			results := make(chan result, requests)
			for range requests {
				go func() {
					req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(`{"order":101}`))
					req.Header.Set(idemhttp.Header, "one-key")
					resp, err := client.Do(req)
					if err != nil {
						results <- result{status: -1, body: err.Error()}
						return
					}
					defer resp.Body.Close()
					body, _ := io.ReadAll(resp.Body)
					results <- result{resp.StatusCode, string(body), resp.Header.Get(idemhttp.ReplayedHeader), resp.Header.Get("Retry-After")}
				}()
			}
			// Hold the handler until every request has arrived (wait bound)
			// or every other one has been answered 409 (short bound).
			for g.arrived.Load() < requests || (tc.wait < time.Minute && g.count(http.StatusConflict) < requests-1) {
				yield()
			}
			close(release)

			var created, replays, conflicts int
			var body string
			for range requests {
				r := <-results
				switch {
				case r.status == http.StatusCreated && r.replayed == "":
					created++
					body = r.body
				case r.status == http.StatusCreated:
					replays++
				case r.status == http.StatusConflict:
					conflicts++
					assert.Equal(t, "1", r.retry, "409 carries Retry-After")
				default:
					t.Errorf("status %d: %s", r.status, r.body)
				}
			}
			assert.Equal(t, int32(1), h.n.Load(), "the handler runs once")
			assert.Equal(t, 1, created)
			if tc.wait == time.Minute {
				assert.Equal(t, requests-1, replays)
				assert.Contains(t, body, `"charge":1`)
			} else {
				assert.Equal(t, requests-1, conflicts)
			}
		})
	}
}

func TestBadKeys(t *testing.T) {
	h := &charges{}
	mw := idemhttp.Middleware(newStore(t, idem.Options{}), idemhttp.Options{Required: true})(h)
	do := func(key *string, body string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, "/charges", strings.NewReader(body))
		if key != nil {
			req.Header.Set(idemhttp.Header, *key)
		}
		w := httptest.NewRecorder()
		mw.ServeHTTP(w, req)
		return w
	}
	ptr := func(s string) *string { return &s }

	w := do(nil, "{}")
	assert.Equal(t, http.StatusBadRequest, w.Code, "missing key where required")
	assert.Equal(t, "application/problem+json", w.Header().Get("Content-Type"))
	assert.Contains(t, w.Body.String(), `"status":400`)

	for name, key := range map[string]string{
		"empty":            "",
		"256 bytes":        strings.Repeat("k", 256),
		"control":          "order\x01101",
		"quoted control":   "\"order\x01\"",
		"no closing quote": `"abc`,
		"inner quote":      `"a"b"`,
		"bad escape":       `"a\x"`,
		"empty quoted":     `""`,
	} {
		w := do(ptr(key), "{}")
		assert.Equal(t, http.StatusBadRequest, w.Code, name)
	}
	assert.Zero(t, h.n.Load(), "no malformed request reached the handler")

	ok := do(ptr(strings.Repeat("k", 255)), "{}")
	assert.Equal(t, http.StatusCreated, ok.Code, "255 bytes is a valid key")

	first := do(ptr("order-101"), `{"amount":450}`)
	require.Equal(t, http.StatusCreated, first.Code)
	other := do(ptr("order-101"), `{"amount":990}`)
	assert.Equal(t, http.StatusUnprocessableEntity, other.Code, "same key, another body")
	quoted := do(ptr(`"order-101"`), `{"amount":450}`)
	assert.Equal(t, http.StatusCreated, quoted.Code)
	assert.Equal(t, "true", quoted.Header().Get(idemhttp.ReplayedHeader), "the quoted form is the same key")
	assert.Equal(t, first.Body.String(), quoted.Body.String())
	escaped := do(ptr(`"a\"b\\c"`), `{}`)
	require.Equal(t, http.StatusCreated, escaped.Code)
	raw := do(ptr(`a"b\c`), `{}`)
	assert.Equal(t, "true", raw.Header().Get(idemhttp.ReplayedHeader), "escapes decode to the raw key")
}

func TestScopesAreSeparate(t *testing.T) {
	h := &charges{}
	srv := serve(t, h, idemhttp.Options{Scope: func(r *http.Request) (string, error) {
		return r.Header.Get("X-Account"), nil
	}})
	send := func(account, body string) string {
		req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(body))
		req.Header.Set(idemhttp.Header, "shared-key")
		req.Header.Set("X-Account", account)
		resp, err := srv.Client().Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	alice1, bob1 := send("alice", "alice's order"), send("bob", "bob's order")
	alice2, bob2 := send("alice", "alice's order"), send("bob", "bob's order")
	assert.Equal(t, int32(2), h.n.Load(), "each scope runs the handler once")
	assert.Equal(t, alice1, alice2)
	assert.Equal(t, bob1, bob2)
	assert.NotContains(t, bob2, "alice")
	assert.NotContains(t, alice2, "bob")
}

func TestUnrememberedResponsesRunAgain(t *testing.T) {
	for _, tc := range []struct {
		name    string
		handler http.HandlerFunc
		opts    idemhttp.Options
	}{
		{"5xx", func(w http.ResponseWriter, r *http.Request) { http.Error(w, "bank down", http.StatusBadGateway) }, idemhttp.Options{}},
		{"429", func(w http.ResponseWriter, r *http.Request) { http.Error(w, "slow down", http.StatusTooManyRequests) }, idemhttp.Options{}},
		{"panic", func(w http.ResponseWriter, r *http.Request) { panic("handler bug") }, idemhttp.Options{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var runs atomic.Int32
			srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs.Add(1)
				tc.handler(w, r)
			}), tc.opts)
			first, body := post(t, srv.Client(), srv.URL, "k", "{}")
			second, _ := post(t, srv.Client(), srv.URL, "k", "{}")
			assert.Equal(t, int32(2), runs.Load(), "the next request must run the handler again")
			assert.Empty(t, second.Header.Get(idemhttp.ReplayedHeader))
			if tc.name == "panic" {
				assert.Equal(t, http.StatusInternalServerError, first.StatusCode)
			}
			_ = body
		})
	}
}

func TestClientHangUpKeepsOutcome(t *testing.T) {
	h := &charges{}
	started, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		once.Do(func() { close(started) })
		<-release
		if err := r.Context().Err(); err != nil {
			t.Errorf("the handler's context was cancelled by the client: %v", err)
		}
		h.ServeHTTP(w, r)
	}), idemhttp.Options{Wait: time.Minute})

	ctx, hangUp := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, strings.NewReader("{}"))
	req.Header.Set(idemhttp.Header, "k")
	done := make(chan error, 1)
	go func() {
		resp, err := srv.Client().Do(req)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	<-started
	hangUp()
	assert.ErrorIs(t, <-done, context.Canceled)
	close(release)

	resp, body := post(t, srv.Client(), srv.URL, "k", "{}")
	assert.Equal(t, http.StatusCreated, resp.StatusCode)
	assert.Equal(t, "true", resp.Header.Get(idemhttp.ReplayedHeader), "the outcome outlived the client")
	assert.Contains(t, body, `"charge":1`)
	assert.Equal(t, int32(1), h.n.Load())
}

func TestFailingBackend(t *testing.T) {
	down := errors.New("connection refused")
	faulty := idemtest.Faulty{Backend: idemtest.NewMemoryBackend(), Fail: func(string) error { return down }}
	for _, failOpen := range []bool{false, true} {
		t.Run(fmt.Sprintf("FailOpen=%v", failOpen), func(t *testing.T) {
			h := &charges{}
			store := newStore(t, idem.Options{Backend: faulty, SettleTimeout: 50 * time.Millisecond}) // Close waits that long for the claim of unknown fate
			srv := httptest.NewServer(idemhttp.Middleware(store, idemhttp.Options{FailOpen: failOpen})(h))
			defer srv.Close()
			resp, body := post(t, srv.Client(), srv.URL, "k", "{}")
			if failOpen {
				assert.Equal(t, http.StatusCreated, resp.StatusCode)
				assert.Equal(t, int32(1), h.n.Load())
			} else {
				assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, body)
				assert.NotEmpty(t, resp.Header.Get("Retry-After"))
				assert.Zero(t, h.n.Load())
			}
		})
	}
}

func TestCredentialsNeverStoredEvenIfAllowed(t *testing.T) {
	h := &charges{}
	srv := serve(t, h, idemhttp.Options{StoredHeaders: []string{"Set-Cookie", "Authorization", "Connection", "Location"}})
	post(t, srv.Client(), srv.URL, "k", "{}")
	retry, _ := post(t, srv.Client(), srv.URL, "k", "{}")
	assert.Equal(t, "true", retry.Header.Get(idemhttp.ReplayedHeader))
	assert.Empty(t, retry.Header.Get("Set-Cookie"))
	assert.Equal(t, "/charges/1", retry.Header.Get("Location"))
}

// A waiter on a response whose body was too large to keep gets the status
// and headers, marked as a replay without its body: never a 409 that would
// run the handler again.
func TestWaitersOnAResponseKeptWithoutBody(t *testing.T) {
	started, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	var runs atomic.Int32
	g := &gate{}
	g.next = idemhttp.Middleware(newStore(t, idem.Options{}), idemhttp.Options{Wait: time.Minute, MaxStoredBody: 1024, MaxWaiters: -1})(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs.Add(1)
			once.Do(func() { close(started) })
			<-release
			w.Write([]byte(strings.Repeat("x", 4096))) // too large to keep
		}))
	srv := httptest.NewServer(g)
	defer srv.Close()
	first := make(chan string, 1)
	go func() {
		_, body := post(t, srv.Client(), srv.URL, "k", "{}")
		first <- body
	}()
	<-started
	waiter := make(chan *http.Response, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("{}"))
		req.Header.Set(idemhttp.Header, "k")
		resp, err := srv.Client().Do(req)
		if err == nil {
			resp.Body.Close()
		}
		waiter <- resp
	}()
	for g.arrived.Load() < 2 {
		yield()
	}
	close(release)
	assert.Len(t, <-first, 4096)
	resp := <-waiter
	require.NotNil(t, resp)
	assert.Equal(t, http.StatusOK, resp.StatusCode, "the waiter is told the handler's status")
	assert.Equal(t, "too-large", resp.Header.Get(idemhttp.BodyOmittedHeader))
	assert.Equal(t, int32(1), runs.Load())
}

func TestPanicAfterWritingAbortsTheResponse(t *testing.T) {
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte(`{"partial":`))
		http.NewResponseController(w).Flush()
		panic("handler bug")
	}), idemhttp.Options{})
	req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("{}"))
	req.Header.Set(idemhttp.Header, "k")
	resp, err := srv.Client().Do(req)
	if err == nil {
		_, err = io.ReadAll(resp.Body)
		resp.Body.Close()
	}
	assert.Error(t, err, "the client must see a broken response, not a short success")
}

func TestImplicitOKKeepsHeaders(t *testing.T) {
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Location", "/x/1") // and returns without writing
	}), idemhttp.Options{})
	post(t, srv.Client(), srv.URL, "k", "{}")
	retry, _ := post(t, srv.Client(), srv.URL, "k", "{}")
	assert.Equal(t, http.StatusOK, retry.StatusCode)
	assert.Equal(t, "/x/1", retry.Header.Get("Location"))
}

func TestFingerprintReadingBodyLeavesItForHandler(t *testing.T) {
	var got string
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got = string(b)
	}), idemhttp.Options{Fingerprint: func(r *http.Request, body []byte) (idem.Fingerprint, error) {
		_, _ = io.ReadAll(r.Body)
		return idemhttp.RequestFingerprint(r, body)
	}})
	post(t, srv.Client(), srv.URL, "k", "the body")
	assert.Equal(t, "the body", got)
}

// An empty scope is refused (it is what a Scope returns when authentication
// did not run): it must not run the handler, nor reach keys stored for
// others.
func TestEmptyScopeCannotReachOthers(t *testing.T) {
	h := &charges{}
	srv := serve(t, h, idemhttp.Options{Scope: func(r *http.Request) (string, error) { return r.Header.Get("X-Account"), nil }})
	req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("{}"))
	req.Header.Set(idemhttp.Header, "k")
	req.Header.Set("X-Account", "alice")
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	anon, _ := post(t, srv.Client(), srv.URL, "5:alice:k", "{}") // no X-Account
	assert.Empty(t, anon.Header.Get(idemhttp.ReplayedHeader))
	assert.Equal(t, http.StatusInternalServerError, anon.StatusCode)
	assert.Equal(t, int32(1), h.n.Load())
}

// A wait bound that runs out before the claim is even tried (a loaded
// server, a bound of a nanosecond) answers 409 with Retry-After, as any
// wait that ran out does, not 503: TestConcurrentRequestsOneKey's short
// bound hung in CI when one duplicate got 503.
func TestWaitBoundOutBeforeTheClaimIs409(t *testing.T) {
	h := &charges{}
	srv := httptest.NewServer(idemhttp.Middleware(newStore(t, idem.Options{}), idemhttp.Options{Wait: time.Nanosecond})(h))
	defer srv.Close()
	req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(`{"order":101}`))
	req.Header.Set(idemhttp.Header, "k")
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusConflict, resp.StatusCode)
	assert.NotEmpty(t, resp.Header.Get("Retry-After"))
	assert.Zero(t, h.n.Load())
}
