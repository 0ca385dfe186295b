package adaptertest

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemhttp"
	"github.com/stretchr/testify/assert"
)

// A Mount says where a framework app puts the guard and its error-writing
// middleware.
type Mount struct {
	// EngineWide mounts the guard on the whole engine (gin's r.Use, echo's
	// e.Use), so that it sees requests that match no route too; false
	// mounts it on a group holding the routes.
	EngineWide bool

	// ErrorsOutside puts the app's error-writing middleware (gin's
	// gin.ErrorLogger, an echo middleware that renders a returned error as
	// JSON) before the guard, outside it; false puts it after the guard,
	// inside.
	ErrorsOutside bool
}

// An ErrorApp builds, with the auth step and the scope as for App, an app
// that serves under the guard, mounted as m says:
//
//   - POST /abort-status: call Fail, then answer 402 with no body the
//     framework's way (gin: c.AbortWithStatus; echo: c.NoContent).
//   - POST /abort-error: call Fail, then fail with 402 and an error (gin:
//     c.AbortWithError; echo: return echo.NewHTTPError).
//   - POST /error: call Fail, then fail with an error and no status (gin:
//     c.Error; echo: return a plain error).
//   - GET /only-get: answer 200; a POST to it is the framework's 405 (gin
//     with HandleMethodNotAllowed).
//
// and nothing at /nowhere.
type ErrorApp func(store *idem.Store[idemhttp.Response], opts idemhttp.Options, env *Env, m Mount) http.Handler

// RunErrorPaths checks, for every Mount, that a framework's own error
// paths never hand a retry less than the first answer: the retry of each
// request above has the first one's status and body, and it is marked as
// a replay exactly when the handler did not run again. A request that
// matches no route, or the wrong method, is never answered 2xx.
func RunErrorPaths(t *testing.T, app ErrorApp) {
	for _, m := range []Mount{{true, true}, {true, false}, {false, true}, {false, false}} {
		name := map[bool]string{true: "engine-wide", false: "per-route"}[m.EngineWide] +
			map[bool]string{true: "/errors-outside", false: "/errors-inside"}[m.ErrorsOutside]
		t.Run(name, func(t *testing.T) {
			for _, c := range []struct {
				path   string
				status int // 0: whatever the framework answers, the same twice
				runs   bool
			}{
				{"/abort-status", http.StatusPaymentRequired, true},
				{"/abort-error", http.StatusPaymentRequired, true},
				{"/error", 0, true},
				{"/nowhere", http.StatusNotFound, false},
				{"/only-get", 0, false}, // 405, or 404 (echo's groups)
			} {
				t.Run(c.path[1:], func(t *testing.T) {
					store := idem.New[idemhttp.Response](idem.Options{})
					defer store.Close()
					env := &Env{started: make(chan struct{}), release: make(chan struct{})}
					srv := httptest.NewServer(app(store, idemhttp.Options{}, env, m))
					defer srv.Close()
					first, body := post(t, srv, c.path, "k", "alice", `{}`)
					retry, again := post(t, srv, c.path, "k", "alice", `{}`)
					if c.status != 0 {
						assert.Equal(t, c.status, first.StatusCode, "the first answer")
					}
					assert.Equal(t, first.StatusCode, retry.StatusCode, "the retry's status")
					assert.Equal(t, body, again, "the retry's body is the first's, never less")
					if !c.runs {
						assert.GreaterOrEqual(t, first.StatusCode, 400, "a request no handler took is never a success")
						assert.NotEmpty(t, body, "the framework's own answer")
						assert.Zero(t, env.fails.Load())
						return
					}
					if retry.Header.Get(idemhttp.ReplayedHeader) == "true" {
						assert.Equal(t, int32(1), env.fails.Load(), "a replay runs nothing")
					} else {
						assert.Equal(t, int32(2), env.fails.Load(), "not replayed: the handler ran again")
					}
				})
			}
		})
	}
}
