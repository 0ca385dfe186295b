// Package idemecho brings idemhttp's Idempotency-Key middleware to echo:
// the same statuses, headers, replays and scoping as idemhttp.Middleware,
// with the scope read from echo's context.
//
// echo.WrapMiddleware is not enough: echo writes a handler's returned error
// (an *echo.HTTPError, say) after the middleware chain has returned, so the
// guard would record an empty 200 and replay it. This adapter has echo
// write the error inside the guard, where it is recorded and replayed like
// any response.
//
// So the guard's middleware returns nil: an outer middleware that maps a
// handler's returned errors to responses never sees them. Put such mapping
// in echo's HTTPErrorHandler, or in middleware after the guard, inside it.
package idemecho

import (
	"context"
	"net/http"

	"github.com/labstack/echo/v4"
	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemhttp"
)

// Options configure Middleware.
type Options struct {
	// Scope returns the client a request acts for, such as the account an
	// earlier auth middleware stored with c.Set, and the key is joined to
	// it (see idemhttp.Options.Scope): idemhttp.ErrNoCredentials, or an
	// error that wraps it, answers 401; another error, or "", 500. Nil
	// means one scope for every request: declare it with HTTP.Unscoped, or
	// the middleware warns once.
	Scope func(c echo.Context) (string, error)

	// HTTP holds every other setting, as idemhttp.Options documents them;
	// its Scope is ignored.
	HTTP idemhttp.Options
}

type ctxKey struct{}

// Middleware returns echo middleware that guards the handler after it as
// idemhttp.Middleware guards an http.Handler. The handler's error is
// written by echo's HTTPErrorHandler inside the guard, so the middleware
// itself returns nil.
func Middleware(store *idem.Store[idemhttp.Response], opts Options) echo.MiddlewareFunc {
	hopts := opts.HTTP
	hopts.Scope = nil
	if opts.Scope != nil {
		hopts.Scope = func(r *http.Request) (string, error) {
			c, _ := r.Context().Value(ctxKey{}).(echo.Context)
			saved := c.Request()
			c.SetRequest(r) // with its body, read already
			defer c.SetRequest(saved)
			return opts.Scope(c)
		}
	}
	guard := idemhttp.NewGuard(store, hopts)
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			res, origReq := c.Response(), c.Request()
			r := origReq
			if opts.Scope != nil { // only Scope needs the framework's context
				r = origReq.WithContext(context.WithValue(origReq.Context(), ctxKey{}, c))
			}
			guard.Serve(res, r, http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
				// The handler writes through an echo.Response of its own
				// onto the guard's recorder, which writes on to res.
				c.SetResponse(echo.NewResponse(w, c.Echo()))
				c.SetRequest(req)
				defer func() {
					c.SetResponse(res)
					c.SetRequest(origReq)
				}()
				if err := next(c); err != nil {
					c.Error(err)
				}
			}))
			return nil
		}
	}
}
