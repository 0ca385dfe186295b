// Package adaptertest holds the behaviour tests every idemhttp adapter must
// pass over real HTTP: the net/http middleware under the standard mux and
// chi, and the gin and echo adapters. Each adapter's test builds the same
// small app in its framework's own style and hands it to Run.
package adaptertest

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemhttp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An Env is what the app's handlers do, shared with the tests that watch
// them. The app must serve, under the guard, with the scope taken from the
// framework's context where an auth step put the X-Account header's value:
//
//   - POST /charges: read the body, call Charge, and answer 201 with the
//     framework's JSON renderer: {"charge": n, "account": account}, with a
//     Location of /charges/n and a Set-Cookie.
//   - POST /slow: call Slow, then do as /charges.
//   - POST /bad: call Fail, then fail with 400 the framework's way (gin:
//     AbortWithStatusJSON; echo: return echo.NewHTTPError).
//   - POST /down: call Fail, then fail with 502 the framework's way.
//   - POST /attach: call Slow, then Charge, then take the connection over
//     the framework's way (as container APIs' attach endpoints do: net/http
//     http.NewResponseController(w).Hijack; gin c.Writer.Hijack; echo
//     c.Response().Hijack) and answer on it with Attach.
type Env struct {
	charges atomic.Int32
	fails   atomic.Int32
	started chan struct{}
	once    sync.Once
	release chan struct{}
}

// Charge counts a run of /charges or /slow and returns its number.
func (e *Env) Charge() int { return int(e.charges.Add(1)) }

// Fail counts a run of /bad or /down.
func (e *Env) Fail() { e.fails.Add(1) }

// Slow blocks until the test lets the slow request go on.
func (e *Env) Slow() {
	e.once.Do(func() { close(e.started) })
	<-e.release
}

// An App builds the app described at Env, guarded by store with opts (whose
// Scope the adapter replaces with one that reads the framework's context).
type App func(store *idem.Store[idemhttp.Response], opts idemhttp.Options, env *Env) http.Handler

// Run runs the behaviour tests against the app that app builds.
func Run(t *testing.T, app App) {
	start := func(t *testing.T, opts idemhttp.Options) (*httptest.Server, *Env) {
		store := idem.New[idemhttp.Response](idem.Options{})
		t.Cleanup(func() { store.Close() })
		env := &Env{started: make(chan struct{}), release: make(chan struct{})}
		srv := httptest.NewServer(app(store, opts, env))
		t.Cleanup(srv.Close)
		return srv, env
	}
	t.Run("ReplaysBytesAndHeaders", func(t *testing.T) {
		srv, env := start(t, idemhttp.Options{})
		first, body := post(t, srv, "/charges", "k", "alice", `{"amount":450}`)
		require.Equal(t, http.StatusCreated, first.StatusCode)
		assert.Contains(t, first.Header.Get("Content-Type"), "application/json")
		retry, replayed := post(t, srv, "/charges", "k", "alice", `{"amount":450}`)
		assert.Equal(t, http.StatusCreated, retry.StatusCode)
		assert.Equal(t, body, replayed, "the same bytes")
		assert.Equal(t, "true", retry.Header.Get(idemhttp.ReplayedHeader))
		assert.Equal(t, first.Header.Get("Content-Type"), retry.Header.Get("Content-Type"), "the same Content-Type")
		assert.Equal(t, "/charges/1", retry.Header.Get("Location"))
		assert.Empty(t, retry.Header.Get("Set-Cookie"), "Set-Cookie is never replayed")
		assert.Equal(t, int32(1), env.charges.Load())
	})
	t.Run("MissingAndMalformedKeyAre400", func(t *testing.T) {
		srv, env := start(t, idemhttp.Options{Required: true})
		resp, _ := post(t, srv, "/charges", "", "alice", `{}`)
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
		resp, _ = post(t, srv, "/charges", strings.Repeat("k", 300), "alice", `{}`)
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
		assert.Zero(t, env.charges.Load())
	})
	t.Run("HandlerErrorTheFrameworksWayIsRemembered", func(t *testing.T) {
		srv, env := start(t, idemhttp.Options{})
		first, body := post(t, srv, "/bad", "k", "alice", `{}`)
		assert.Equal(t, http.StatusBadRequest, first.StatusCode, "the framework's error reaches the client as it wrote it")
		retry, replayed := post(t, srv, "/bad", "k", "alice", `{}`)
		assert.Equal(t, http.StatusBadRequest, retry.StatusCode, "a 4xx is remembered and replayed as it was")
		assert.Equal(t, body, replayed)
		assert.Equal(t, "true", retry.Header.Get(idemhttp.ReplayedHeader))
		assert.Equal(t, int32(1), env.fails.Load())
	})
	t.Run("ServerErrorIsNotRemembered", func(t *testing.T) {
		srv, env := start(t, idemhttp.Options{})
		first, _ := post(t, srv, "/down", "k", "alice", `{}`)
		assert.Equal(t, http.StatusBadGateway, first.StatusCode)
		retry, _ := post(t, srv, "/down", "k", "alice", `{}`)
		assert.Equal(t, http.StatusBadGateway, retry.StatusCode)
		assert.Empty(t, retry.Header.Get(idemhttp.ReplayedHeader))
		assert.Equal(t, int32(2), env.fails.Load(), "a 5xx releases the key: the retry runs again")
	})
	t.Run("DifferentRequestIs422", func(t *testing.T) {
		srv, env := start(t, idemhttp.Options{})
		post(t, srv, "/charges", "k", "alice", `{"amount":450}`)
		resp, _ := post(t, srv, "/charges", "k", "alice", `{"amount":900}`)
		assert.Equal(t, http.StatusUnprocessableEntity, resp.StatusCode)
		assert.Equal(t, int32(1), env.charges.Load())
	})
	t.Run("InFlightIs409AfterTheBound", func(t *testing.T) {
		srv, env := start(t, idemhttp.Options{Wait: 50 * time.Millisecond})
		first := make(chan string, 1)
		go func() {
			_, body := post(t, srv, "/slow", "k", "alice", `{}`)
			first <- body
		}()
		<-env.started
		resp, _ := post(t, srv, "/slow", "k", "alice", `{}`)
		assert.Equal(t, http.StatusConflict, resp.StatusCode)
		assert.NotEmpty(t, resp.Header.Get("Retry-After"))
		close(env.release)
		body := <-first
		resp, replayed := post(t, srv, "/slow", "k", "alice", `{}`)
		assert.Equal(t, http.StatusCreated, resp.StatusCode)
		assert.Equal(t, body, replayed)
		assert.Equal(t, int32(1), env.charges.Load())
	})
	t.Run("HijackedHandlerIsNotRunAgain", func(t *testing.T) {
		// The handler answered on the raw connection: it finished, so its
		// retries replay that it did, whether they wait on it or come after.
		srv, env := start(t, idemhttp.Options{})
		first := make(chan string, 1)
		go func() {
			_, body := post(t, srv, "/attach", "k", "alice", `{}`)
			first <- body
		}()
		<-env.started
		duplicate := make(chan *http.Response, 1)
		go func() {
			resp, _ := post(t, srv, "/attach", "k", "alice", `{}`)
			duplicate <- resp
		}()
		close(env.release)
		assert.Equal(t, attached, <-first, "the first answer is the one written on the connection")
		for _, retry := range []*http.Response{<-duplicate, must(post(t, srv, "/attach", "k", "alice", `{}`))} {
			assert.Equal(t, http.StatusOK, retry.StatusCode)
			assert.Equal(t, "true", retry.Header.Get(idemhttp.ReplayedHeader))
			assert.Equal(t, "hijacked", retry.Header.Get(idemhttp.BodyOmittedHeader))
		}
		assert.Equal(t, int32(1), env.charges.Load(), "the hijacked handler ran once")
	})
	t.Run("ScopesAreIsolated", func(t *testing.T) {
		srv, env := start(t, idemhttp.Options{})
		_, alice := post(t, srv, "/charges", "same-key", "alice", `{}`)
		_, bob := post(t, srv, "/charges", "same-key", "bob", `{}`)
		_, alice2 := post(t, srv, "/charges", "same-key", "alice", `{}`)
		_, bob2 := post(t, srv, "/charges", "same-key", "bob", `{}`)
		assert.Equal(t, int32(2), env.charges.Load(), "each account runs once")
		assert.Contains(t, alice, `"alice"`)
		assert.Contains(t, bob, `"bob"`)
		assert.Equal(t, alice, alice2)
		assert.Equal(t, bob, bob2)
	})
}

// must returns the response of a post.
func must(resp *http.Response, _ string) *http.Response { return resp }

// attached is the body /attach answers on the connection it takes over.
const attached = "attached\n"

// Attach answers a request whose handler took its connection over: a
// complete HTTP/1.1 response written on the connection, which it closes.
func Attach(conn net.Conn, rw *bufio.ReadWriter) error {
	defer conn.Close()
	_, err := fmt.Fprintf(rw, "HTTP/1.1 200 OK\r\nContent-Type: application/vnd.docker.raw-stream\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(attached), attached)
	if err == nil {
		err = rw.Flush()
	}
	return err
}

// post sends a POST to path with body, key (if not empty) and account.
func post(t *testing.T, srv *httptest.Server, path, key, account, body string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader(body))
	require.NoError(t, err)
	if key != "" {
		req.Header.Set(idemhttp.Header, key)
	}
	req.Header.Set("X-Account", account)
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, string(b)
}

// ChargeJSON is the body /charges answers, for apps that render a map.
func ChargeJSON(n int, account string) map[string]any {
	return map[string]any{"charge": n, "account": account}
}

// Location is the Location header /charges sets.
func Location(n int) string { return fmt.Sprintf("/charges/%d", n) }
