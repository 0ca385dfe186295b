// Package idemgin brings idemhttp's Idempotency-Key middleware to gin: the
// same statuses, headers, replays and scoping as idemhttp.Middleware, with
// the scope read from gin's context. It may be mounted engine-wide
// (r.Use) or on a group or route.
//
// Two gin paths are not guarded, because gin writes their answer after the
// guard has returned, where it cannot be recorded: a request that matches
// no route (gin's 404 and 405) passes through, and so do the engine's
// NoRoute and NoMethod handlers, which must not have effects a retry would
// repeat (guard such a fallback with a route of its own); and a handler that ends
// with errors in c.Errors (c.Error, c.AbortWithError) and no body releases
// its key, so that the error written by a middleware outside the guard,
// such as gin.ErrorLogger, is sent as it is and a retry runs the handler
// again. To have such an error remembered and replayed, write it inside
// the guard: in the handler, or in error-writing middleware mounted after
// the guard.
//
// Wrapping idemhttp.Middleware with gin's own helpers is not enough: gin
// sends a response's status only when the body starts, after a renderer
// such as c.JSON has set Content-Type, so a recorder placed under gin's
// writer sees the headers too early. This adapter holds the status back as
// gin does.
package idemgin

import (
	"bufio"
	"context"
	"net"
	"net/http"

	"github.com/gin-gonic/gin"
	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemhttp"
)

// Options configure Middleware.
type Options struct {
	// Scope returns the client a request acts for, such as the account an
	// earlier auth handler stored with c.Set, and the key is joined to it
	// (see idemhttp.Options.Scope): idemhttp.ErrNoCredentials, or an error
	// that wraps it, answers 401; another error, or "", 500. Nil means one
	// scope for every request:
	// declare it with HTTP.Unscoped, or the middleware warns once.
	Scope func(c *gin.Context) (string, error)

	// HTTP holds every other setting, as idemhttp.Options documents them;
	// its Scope is ignored.
	HTTP idemhttp.Options
}

type ctxKey struct{}

// Middleware returns a gin handler that guards the handlers after it as
// idemhttp.Middleware guards an http.Handler. A request it answers itself
// (a replay, a refusal) is aborted, so the rest of the chain does not run.
func Middleware(store *idem.Store[idemhttp.Response], opts Options) gin.HandlerFunc {
	hopts := opts.HTTP
	hopts.Scope = nil
	if opts.Scope != nil {
		hopts.Scope = func(r *http.Request) (string, error) {
			c, _ := r.Context().Value(ctxKey{}).(*gin.Context)
			saved := c.Request
			c.Request = r // with its body, read already
			defer func() { c.Request = saved }()
			return opts.Scope(c)
		}
	}
	guard := idemhttp.NewGuard(store, hopts)
	return func(c *gin.Context) {
		if c.FullPath() == "" {
			// No route matched: gin answers 404 or 405 itself once the
			// chain returns, after the guard could record it. A NoRoute
			// handler of the user's runs unguarded too (documented).
			c.Next()
			return
		}
		orig, origReq := c.Writer, c.Request
		r := origReq
		if opts.Scope != nil { // only Scope needs the framework's context
			r = origReq.WithContext(context.WithValue(origReq.Context(), ctxKey{}, c))
		}
		ran := false
		defer abortOnPanic(orig)
		guard.Serve(sendsNow{orig}, r, http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			ran = true
			gw := &writer{ResponseWriter: orig, out: w}
			c.Writer, c.Request = gw, req
			defer func() { c.Writer, c.Request = orig, origReq }()
			before := len(c.Errors) // errors of middleware outside the guard are not the handler's
			c.Next()
			if !gw.forwarded && len(c.Errors) > before && (gw.status == 0 || gw.status >= 400) {
				// gin's error pattern: c.Error or c.AbortWithError, with no
				// body yet, for a middleware outside the guard (or gin
				// itself) to render once the guard has returned. That
				// answer cannot be recorded, so the key is released, as
				// for any error, and the status is left to gin's writer.
				idemhttp.ReleaseKey(w)
				if gw.status != 0 {
					orig.WriteHeader(gw.status)
				}
				return
			}
			gw.WriteHeaderNow() // a status set with no body: send it now, inside the guard
			gw.forward()
		}))
		if !ran {
			c.Abort()
		}
	}
}

// sendsNow is gin's writer as the guard writes to it: a final status goes
// out at WriteHeader, as net/http's does, rather than waiting for gin's
// WriteHeaderNow. The guard sends a status when the response is the one
// it means to send: at once for a response that passes through, but only
// once its transaction has committed for one held (Options.InTx), so
// gin's writer must not be made to send one earlier from inside the
// handler (which would send 200, gin's default, before the commit, and
// then ignore the handler's own status).
type sendsNow struct{ gin.ResponseWriter }

func (w sendsNow) WriteHeader(code int) {
	w.ResponseWriter.WriteHeader(code)
	// gin sends no informational status (it would end the response), but
	// 101 Switching Protocols is the final one.
	if code >= 200 || code == http.StatusSwitchingProtocols {
		w.ResponseWriter.WriteHeaderNow()
	}
}

func (w sendsNow) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// abortOnPanic makes sure that a response the guard aborts
// (http.ErrAbortHandler, after a handler panicked mid-response) reaches the
// client as aborted: gin.Recovery takes that panic for a broken pipe and
// would end the half-written response as if it were whole. So the
// connection is closed here before the panic goes on.
func abortOnPanic(w http.ResponseWriter) {
	v := recover()
	if v == nil {
		return
	}
	if v == http.ErrAbortHandler { //nolint:errorlint // the sentinel itself is what net/http panics with
		// gin's own writer refuses to hijack once a body is out: go round it.
		if u, ok := w.(interface{ Unwrap() http.ResponseWriter }); ok {
			w = u.Unwrap()
		}
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			_ = conn.Close()
		}
	}
	panic(v)
}

// writer is the gin.ResponseWriter a guarded handler writes to. Its status
// waits for the body, as gin's own writer's does, so the headers recorded
// and sent are those a renderer set after choosing the status. It waits
// even past WriteHeaderNow (which c.AbortWithStatus calls), until the body,
// a flush or the handler's return: a handler that ends with c.Errors and
// no body has its error written outside the guard, and the key released.
// What only gin knows (CloseNotify, Pusher) comes from gin's writer.
type writer struct {
	gin.ResponseWriter                     // gin's writer for the request
	out                http.ResponseWriter // the guard's recorder, in front of gin's writer
	status             int
	size               int
	sent               bool // the status is final, as gin's Written reports
	forwarded          bool // and out has it
}

// forward passes the status on to the recorder, once.
func (w *writer) forward() {
	if !w.forwarded {
		w.forwarded = true
		w.out.WriteHeader(w.status)
	}
}

func (w *writer) Header() http.Header { return w.out.Header() }

func (w *writer) WriteHeader(code int) {
	if code > 0 && !w.sent {
		w.status = code
	}
}

func (w *writer) WriteHeaderNow() {
	if w.sent {
		return
	}
	w.sent = true
	if w.status == 0 {
		w.status = http.StatusOK
	}
}

func (w *writer) Write(p []byte) (int, error) {
	w.WriteHeaderNow()
	w.forward()
	n, err := w.out.Write(p)
	w.size += n
	return n, err
}

func (w *writer) WriteString(s string) (int, error) { return w.Write([]byte(s)) }

func (w *writer) Status() int {
	if w.status == 0 {
		return http.StatusOK
	}
	return w.status
}

// Size is gin's: -1 until the status is sent, then the bytes written.
func (w *writer) Size() int {
	if !w.sent {
		return -1
	}
	return w.size
}

func (w *writer) Written() bool { return w.sent }

func (w *writer) Flush() {
	w.WriteHeaderNow()
	w.forward()
	_ = http.NewResponseController(w.out).Flush()
}

func (w *writer) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	w.sent, w.forwarded = true, true
	return http.NewResponseController(w.out).Hijack()
}

// Unwrap lets http.ResponseController reach the guard's recorder.
func (w *writer) Unwrap() http.ResponseWriter { return w.out }

var _ gin.ResponseWriter = (*writer)(nil)
