package idemhttp

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/internal/limit"
	"github.com/seed094d4201/idem/internal/waitctx"
)

// Options configure Middleware. Every zero field means the default it
// documents.
type Options struct {
	// Methods are the request methods the middleware guards; requests with
	// other methods pass straight through. Nil means POST and PATCH.
	Methods []string

	// Required makes a guarded request without an Idempotency-Key header
	// fail with 400. False lets such a request through unguarded.
	Required bool

	// Scope returns the client a request acts for, such as the
	// authenticated account, and the key is joined to it: two clients that
	// happen to send the same key never share an outcome, and one can never
	// read the other's stored response. Run the middleware after
	// authentication so that Scope can see who is calling. It sees the
	// request with its whole body, read already (within MaxRequestBody),
	// for a scope that needs it, such as a signed webhook's sender.
	//
	// A request that carries no credentials (a client that forgot its
	// account header) is the client's mistake: Scope says so by returning
	// ErrNoCredentials, or an error that wraps it, and the request is
	// answered 401 with a problem detail, its handler not run (a
	// WriteError may add the WWW-Authenticate challenge of the service's
	// authentication, which the middleware does not know). Any other
	// error answers 500 and runs nothing, and so does an empty scope: it
	// is what a Scope returns when authentication did not run, and would
	// put every such caller in one scope.
	//
	// Nil means one scope for every request, which is right only when one
	// client alone can reach the handler; say so with Unscoped, or the
	// middleware warns once when it is made. Either way a scoped route's
	// keys and an unscoped route's live apart (StoreKey), so one store can
	// serve both: no key sent to one can reach the other's records.
	Scope func(*http.Request) (string, error)

	// Unscoped declares that one client alone reaches the handler, so that
	// a nil Scope is a choice rather than an oversight, and is not warned
	// about. It is ignored, with an error logged once, when Scope is set.
	Unscoped bool

	// ScopeQuota bounds the new keys one scope may make within
	// ScopeQuotaWindow: past it, a request with a new key is answered 429
	// with Retry-After, while the scope's known keys still replay and
	// other scopes are untouched. Without Scope, every request is of one
	// scope, so it bounds the route. A key counts from its claim until its
	// window passes, unless its handler's response is not remembered (a
	// 5xx, a panic): that key is given back. It is counted by this
	// process: with a Backend shared by N instances behind a balancer, a
	// scope may make up to N times the quota in the backend, and the
	// backend holds at most that many of its keys per window. A request
	// over the quota still costs a claim and a release in the Backend: it
	// bounds the keys kept, not the request rate, which is a rate
	// limiter's job. The store's MaxKeys is shared by every scope: without
	// a quota one scope can fill it for all (503s), so on a server with
	// many clients set one, with the quota times the scopes active at
	// once within MaxKeys. Zero or negative means no quota.
	ScopeQuota int

	// ScopeQuotaWindow is the window ScopeQuota counts over. Set it to the
	// store's TTL, for a quota of keys remembered at once. Zero means 24
	// hours, the store's default TTL.
	ScopeQuotaWindow time.Duration

	// MaxWaiters bounds the requests with one key held at once in this
	// process besides the one that runs it: duplicates waiting for its
	// outcome, and replays of a finished key still being read from the
	// Backend (each holds its body and a goroutine). One more is answered
	// 409 with Retry-After at once. Zero means 8; negative means no bound.
	MaxWaiters int

	// Fingerprint identifies a request, to refuse a key reused for a
	// different one with 422. It sees the request and its whole body. Nil
	// means RequestFingerprint; JSONFingerprint ignores key order and
	// whitespace in JSON bodies.
	Fingerprint func(r *http.Request, body []byte) (idem.Fingerprint, error)

	// Wait bounds how long a request whose key is in flight, here or on
	// another instance sharing the store's Backend, waits for that
	// execution's outcome, to replay it, before it is answered 409 with
	// Retry-After. It bounds the whole claim, so it must also cover a round
	// trip to the Backend. Zero or negative means 10 seconds.
	Wait time.Duration

	// RetryAfter is what a 409 for a key in flight, or a 503, tells the
	// client to wait. Zero means one second.
	RetryAfter time.Duration

	// StoredHeaders, if not nil, are the only response headers remembered
	// and replayed with the status and body. Nil means every header the
	// handler set (Content-Type, Content-Encoding, Content-Disposition,
	// Location, ETag, ...), but those in SkipHeaders. Either way hop-by-hop
	// headers, Set-Cookie, Authorization, Proxy-Authenticate,
	// WWW-Authenticate, Content-Length and Date are never stored: a replay
	// carries credentials of no one, and a fresh Date and length; and
	// Content-Encoding and Content-Range, which say what the stored body's
	// bytes are, are always stored with it.
	StoredHeaders []string

	// SkipHeaders are response headers never remembered, besides those
	// above, such as a per-response X-Request-Id. Nil means none.
	// Content-Encoding and Content-Range are remembered all the same.
	SkipHeaders []string

	// MaxStoredBody bounds the response body remembered, in bytes. A larger
	// response is delivered whole; its outcome is remembered without the
	// body (see Middleware). Zero means 1 MiB.
	MaxStoredBody int

	// MaxRequestBody bounds the request body read to fingerprint it; a
	// larger one is answered 413. Zero means 1 MiB.
	MaxRequestBody int64

	// FailOpen runs the handler unguarded when the store's backend cannot
	// claim the key (it is unreachable, say) instead of answering 503. It
	// trades the guarantee for availability: a retry may then execute
	// twice. Other store failures are 503 all the same. It does not apply
	// with InTx, whose handler's transaction is the claim's.
	FailOpen bool

	// InTx, if set, is the transactional mode: each guarded handler runs
	// in a transaction of the store's database that also claims its key,
	// and its rows, its key and its whole response (status, stored
	// headers, body) commit together before the response is sent. Set it
	// to the InTx of the store's Backend package, such as
	// postgres.InTx[idemhttp.Response] (mysql and sqlite have theirs), and
	// have the handler write through the transaction that package's
	// TxFromContext finds in the request's context. A crash at any instant
	// leaves either nothing (the retry runs the handler afresh) or
	// everything (the retry replays the response); without InTx, a crash
	// between the handler's own commit and the response being recorded
	// leaves the key interrupted, answered 500 until an operator settles
	// it. See "Transactional mode" in the package doc for what the
	// handler must not do there. Nil means the handler runs outside any
	// transaction of the middleware's.
	InTx func(ctx context.Context, store *idem.Store[Response], key string, payload any, fn func(ctx context.Context) (Response, error)) (Response, error)

	// WriteError answers a request the middleware refuses or cannot serve
	// (400, 401, 409, 413, 422, 500, 503), so that a service can answer in its
	// own error format. The middleware has already set Retry-After where it
	// applies. Nil means an RFC 9457 application/problem+json body.
	WriteError func(w http.ResponseWriter, r *http.Request, p Problem)

	// Logger receives what cannot be told to the client: a handler panic, an
	// outcome the backend failed to record. Each line carries the request's
	// Idempotency-Key (key) and scope. Refusals a client can cause at will
	// (a full store, a key in flight, no credentials for the scope) are
	// logged at Debug at most, so that no client can flood the log. Nil
	// means slog.Default().
	Logger *slog.Logger

	// HashKeysInLogs logs the SHA-256 of each Idempotency-Key (key_sha256)
	// instead of the key, for keys that carry personal data: the errors
	// logged with it (a backend's, which may name the key) have the key
	// replaced by the hash too.
	HashKeysInLogs bool
}

const (
	defaultWait           = 10 * time.Second
	defaultRetryAfter     = time.Second
	defaultMaxStoredBody  = 1 << 20
	defaultMaxRequestBody = 1 << 20
)

// A Guard is the machinery behind Middleware, for adapters that bring it to
// other web frameworks (packages idemgin and idemecho): it guards one
// request at a time through Serve. Make one with NewGuard; it is safe for
// concurrent use.
type Guard struct {
	opts    Options
	methods map[string]bool
	headers headerPolicy
	store   *idem.Store[Response]
	quota   *limit.Quota   // new keys per scope
	waiters *limit.Waiters // requests held per key

	// defaultFP: Fingerprint is RequestFingerprint, which reads neither
	// the request's body nor its context, so it needs no copy of its own.
	defaultFP bool

	emptyScopeSeen atomic.Bool // the first empty scope is logged at Error, the rest at Debug
}

// Middleware returns middleware that runs each guarded request's handler at
// most once per Idempotency-Key (within the request's scope) and replays the
// stored response, with Idempotent-Replayed: true, to every retry. A
// response stored gzip or deflate (a compression middleware inside the
// guard) is decoded for a retry whose Accept-Encoding does not accept it;
// one that cannot be (another coding, a range of the encoded bytes, a body
// coded twice over that decodes past 1032 times its size) is 406.
//
// A request with the key of a request still in flight waits up to
// opts.Wait for its outcome, then is answered 409 Conflict with Retry-After.
// The same key with a different request (by opts.Fingerprint) is 422; a
// missing key, when opts.Required, or a malformed one is 400; a store that
// fails is 503 unless opts.FailOpen; a key whose recorded outcome is a
// final error (an operator's: idem resolve -error) is 500, without
// Retry-After. Error responses are RFC 9457 application/problem+json.
//
// A response is remembered if its status is 2xx, 3xx, or 4xx other than 408,
// 409, 425 and 429; one that was streamed (Flush), larger than
// opts.MaxStoredBody, or shorter or longer than the Content-Length it was
// sent with is remembered without its body, and its replay says so
// (BodyOmittedHeader). So is a handler that took the connection over
// (Hijack) and answered on it: it finished, and never runs again. Headers the handler found set (by middleware outside
// the guard) and left as they were are not remembered: a replay carries
// the retry's own. Any other status, or a panic, is delivered as it is but
// releases the key, so the next retry runs the handler again.
//
// A write the handler's goroutines make after it returned fails, and is
// neither sent nor remembered: the response is the one it returned with.
//
// The handler runs under a context that a client hanging up does not cancel,
// and the outcome is recorded under it too, so a completed response is never
// lost. The store's own options (TTL, Backend) decide how long and where
// responses are kept.
func Middleware(store *idem.Store[Response], opts Options) func(http.Handler) http.Handler {
	g := NewGuard(store, opts)
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { g.Serve(w, r, next) })
	}
}

// NewGuard returns the Guard that Middleware(store, opts) runs.
func NewGuard(store *idem.Store[Response], opts Options) *Guard {
	g := &Guard{opts: opts, store: store, methods: make(map[string]bool), headers: newHeaderPolicy(opts.StoredHeaders, opts.SkipHeaders)}
	if g.opts.Methods == nil {
		g.opts.Methods = []string{http.MethodPost, http.MethodPatch}
	}
	for _, m := range g.opts.Methods {
		g.methods[m] = true
	}
	if g.opts.Fingerprint == nil {
		g.opts.Fingerprint, g.defaultFP = RequestFingerprint, true
	}
	if g.opts.Wait <= 0 {
		g.opts.Wait = defaultWait
	}
	if g.opts.RetryAfter <= 0 {
		g.opts.RetryAfter = defaultRetryAfter
	}
	if g.opts.MaxStoredBody <= 0 {
		g.opts.MaxStoredBody = defaultMaxStoredBody
	}
	if g.opts.MaxRequestBody <= 0 {
		g.opts.MaxRequestBody = defaultMaxRequestBody
	}
	if g.opts.Logger == nil {
		g.opts.Logger = slog.Default()
	}
	if g.opts.WriteError == nil {
		g.opts.WriteError = WriteProblem
	}
	g.quota = limit.NewQuota(g.opts.ScopeQuota, g.opts.ScopeQuotaWindow, nil)
	g.waiters = limit.NewWaiters(g.opts.MaxWaiters)
	switch {
	case g.opts.Scope == nil && !g.opts.Unscoped:
		g.opts.Logger.Warn("idemhttp: Options.Scope is nil, so every client shares one key space; set Scope, or Unscoped if one client alone reaches this handler")
	case g.opts.Scope != nil && g.opts.Unscoped:
		g.opts.Logger.Error("idemhttp: Options.Scope and Unscoped are both set; Scope is used")
	}
	return g
}

// notStored carries a response that was delivered but may not be remembered
// (a 5xx, a streamed or oversized body) to the requests that waited on it.
// complete is false when the recorder does not hold all of it.
type notStored struct {
	resp     Response
	complete bool
}

func (e *notStored) Error() string {
	return "idemhttp: response not remembered (status " + strconv.Itoa(e.resp.Status) + ")"
}

// Serve guards one request as Middleware does: it answers r itself (a
// replay, or a refusal), or runs next with a ResponseWriter that passes the
// response through to w and records it. An adapter gives next a handler
// that runs the framework's own chain on the ResponseWriter and request it
// is passed.
func (g *Guard) Serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	if !g.methods[r.Method] {
		next.ServeHTTP(w, r)
		return
	}
	values := r.Header.Values(Header)
	switch {
	case len(values) == 0 && g.opts.Required:
		g.fail(w, r, http.StatusBadRequest, "This request needs an Idempotency-Key header.", 0, nil)
		return
	case len(values) == 0:
		next.ServeHTTP(w, r)
		return
	case len(values) > 1:
		g.fail(w, r, http.StatusBadRequest, "Send one Idempotency-Key header, not several.", 0, nil)
		return
	}
	key, err := ParseKey(values[0])
	if err != nil {
		g.fail(w, r, http.StatusBadRequest, "Malformed Idempotency-Key: "+err.Error(), 0, err)
		return
	}
	body, err := readBody(http.MaxBytesReader(w, r.Body, g.opts.MaxRequestBody), r.ContentLength, g.opts.MaxRequestBody)
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			g.fail(w, r, http.StatusRequestEntityTooLarge, fmt.Sprintf("The request body is larger than %d bytes.", tooLarge.Limit), 0, err)
		} else {
			g.fail(w, r, http.StatusBadRequest, "Reading the request body: "+err.Error(), 0, err)
		}
		return
	}
	// The handler gets a copy of the request with the body it would have
	// read, under a context the client cannot cancel; Fingerprint gets one
	// of its own, so reading the body there leaves the handler's whole.
	// detached is that context, made only where it is used: a first
	// request's handler runs under the execution's own.
	detached := func() context.Context { return context.WithoutCancel(r.Context()) }
	var fp idem.Fingerprint
	if g.defaultFP {
		fp, err = RequestFingerprint(r, body)
	} else {
		fp, err = g.opts.Fingerprint(withBody(r, detached(), body), body)
	}
	if err != nil {
		g.fail(w, r, http.StatusBadRequest, err.Error(), 0, err)
		return
	}
	scope := ""
	if g.opts.Scope != nil {
		if scope, err = g.opts.Scope(withBody(r, r.Context(), body)); err == nil && scope == "" {
			err = errEmptyScope
			if !g.emptyScopeSeen.Swap(true) {
				// A server bug, not the client's: said loudly once, then
				// at Debug, so that no client can flood the log with it.
				g.opts.Logger.Error("idemhttp: Options.Scope returned an empty scope; requests are refused with 500 (does the authentication middleware run before this one? A Scope that finds no credentials returns idemhttp.ErrNoCredentials, answered 401)", "path", r.URL.Path)
			}
		}
		if err != nil {
			// A client without credentials can cause this at will: Debug.
			g.opts.Logger.Debug("idemhttp: scope", "err", err)
			if errors.Is(err, ErrNoCredentials) {
				// The client's mistake, not the server's: it can mend it.
				g.fail(w, r, http.StatusUnauthorized, "The request carries no credentials; send them and retry with the same Idempotency-Key.", 0, err)
				return
			}
			g.fail(w, r, http.StatusInternalServerError, "The request's scope could not be determined.", 0, err)
			return
		}
	}

	// A duplicate waits at most opts.Wait, for a request in flight here or
	// on another instance; if this request claims the key, its handler runs
	// right here, writing straight to the client, under a context the
	// client cannot cancel. The request given to the handler is made only
	// where one runs or answers: a first request's handler gets its own
	// under the execution's context.
	storeKey := StoreKey(scope, key) // unscoped: the empty scope, which Scope never gives
	lk := logKey{g, scope, key}
	if !g.waiters.Enter(storeKey) {
		g.opts.Logger.Debug("idemhttp: too many duplicates of one key waiting; request refused", lk.with()...)
		g.fail(w, r, http.StatusConflict, "As many requests with this Idempotency-Key as the server holds are waiting already; retry with the same key.", g.opts.RetryAfter, nil)
		return
	}
	defer g.waiters.Leave(storeKey)
	if g.opts.InTx != nil {
		g.serveTx(w, r, withBody(r, detached(), body), next, storeKey, fp, scope, lk)
		return
	}
	// The wait ends with the client: a duplicate whose client hung up holds
	// no goroutine, body nor MaxWaiters slot for the rest of Wait. The work,
	// if this request claims the key, runs under ctx, which it cannot end.
	bctx := waitctx.WithTimeout(r.Context(), g.opts.Wait)
	defer bctx.Stop()
	t, err := g.store.Begin(bctx, storeKey, fp[:])
	err = waitctx.RanOut(bctx, err) // the bound ran out before the claim was tried (a loaded server)
	if err != nil || t.Replayed() {
		var resp Response
		if err == nil {
			resp, err = t.Result()
		}
		if err == nil { // a replay: no copy of the request unless it is refused
			g.replayTo(w, r.Header, func() *http.Request { return withBody(r, detached(), body) }, resp, lk)
			return
		}
		g.answer(w, withBody(r, detached(), body), next, resp, err, scope, lk)
		return
	}
	// Counted only for a key this request claimed, so that replays and
	// the duplicates waiting on a key never spend the scope's quota, and
	// a scope over it still gets its known keys' replays. The key claimed
	// over the quota is let go, and anything waiting on it hears so.
	quota, withinQuota := g.quota.Reserve(scope)
	if !withinQuota {
		_, err = t.Finish(Response{}, errOverQuota)
		g.answer(w, withBody(r, detached(), body), next, Response{}, err, scope, lk)
		return
	}
	kept := false
	defer func() {
		if !kept { // released, or the handler ended its goroutine: it holds nothing
			quota.Cancel()
		}
	}()
	// The headers outer middleware set, to undo what a handler that panics
	// set; none (nil) when there are none, which spares the copy.
	var before http.Header
	if h := w.Header(); len(h) > 0 {
		before = h.Clone()
	}
	rec := newRecorder(w, g.headers, g.opts.MaxStoredBody)
	rec.before = before
	_, err = t.Do(func(ctx context.Context) (Response, error) {
		defer rec.end() // a panic or a Goexit ends it too
		next.ServeHTTP(rec, withBody(r, ctx, body))
		rec.end()
		resp, ok := rec.response()
		if !ok {
			return resp, &notStored{resp, rec.complete()}
		}
		return resp, nil
	})
	kept = err == nil
	if err != nil {
		g.afterRun(w, withBody(r, detached(), body), before, rec.resp.Status != 0 || rec.hijacked, err, lk)
	}
}

// withBody returns a copy of r under ctx whose body reads body from the
// start.
func withBody(r *http.Request, ctx context.Context, body []byte) *http.Request {
	c := r.WithContext(ctx)
	br := new(bodyReader)
	br.Reset(body)
	c.Body = br
	return c
}

// bodyReader is io.NopCloser(bytes.NewReader(body)) in one allocation
// rather than two; it keeps bytes.Reader's WriteTo, as NopCloser does.
type bodyReader struct{ bytes.Reader }

func (*bodyReader) Close() error { return nil }

// readBody is io.ReadAll sized for a body whose length is declared (size
// at most limit), so that it is read into one buffer rather than grown,
// up to maxUpfront: past that, the buffer grows as the bytes come, so
// that a client that declares a large body and sends none of it (one per
// connection, stalled) costs the server no more than that each.
func readBody(r io.Reader, size, limit int64) ([]byte, error) {
	if size < 0 || size > limit {
		return io.ReadAll(r)
	}
	b := make([]byte, 0, min(size+1, maxUpfront)) // one more, to see the end without growing
	for {
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err != nil {
			if err == io.EOF { //nolint:errorlint // io.Reader's contract: EOF itself
				err = nil
			}
			return b, err
		}
		switch {
		case len(b) < cap(b):
		case int64(cap(b)) <= size: // the bytes come: double, up to the size declared and one more
			b = slices.Grow(b, int(min(size+1, 2*int64(cap(b))))-len(b))
		default:
			b = append(b, 0)[:len(b)] // longer than declared: grow as ReadAll does
		}
	}
}

// maxUpfront is the most readBody allocates for a body before its bytes
// arrive.
const maxUpfront = 64 << 10

// afterRun finishes a request whose handler ran here and has written its
// response, or started to, or took the connection over (written).
func (g *Guard) afterRun(w http.ResponseWriter, r *http.Request, before http.Header, written bool, err error, lk logKey) {
	if err == nil {
		return
	}
	var pe *idem.PanicError // declared past the common path: it escapes, an allocation
	switch {
	case errors.As(err, &pe) || errors.Is(err, idem.ErrGoexit):
		switch {
		case pe == nil: // the handler ran on a goroutine of its own (InTx), which it ended
			g.opts.Logger.Error("idemhttp: handler called runtime.Goexit; its key is released", lk.with()...)
		case errors.Is(pe, http.ErrAbortHandler):
			panic(http.ErrAbortHandler) // the handler asked to abort the response
		default:
			g.opts.Logger.Error("idemhttp: handler panicked; its key is released", lk.with("panic", pe.Value, "stack", string(pe.Stack))...)
		}
		if written {
			// Part of a response is out: abort it, as net/http would, so
			// the client does not take it for a whole one.
			panic(http.ErrAbortHandler)
		}
		// The headers the handler set (a Location, a cookie, a
		// Content-Encoding) belong to a response that never happened.
		h := w.Header()
		clear(h)
		for k, v := range before {
			h[k] = v
		}
		g.fail(w, r, http.StatusInternalServerError, "The request failed; it may be retried with the same key.", 0, err)
	default:
		if _, plain := err.(*notStored); !plain { // a release that failed too
			g.opts.Logger.Error("idemhttp: releasing the key of an unremembered response", lk.with("err", err)...)
		}
	}
}

// answer responds to a request whose handler did not run here: a replay, or
// why there is none.
func (g *Guard) answer(w http.ResponseWriter, req *http.Request, next http.Handler, resp Response, err error, scope string, lk logKey) {
	if err == nil {
		g.replay(w, req, resp, lk)
		return
	}
	var ns *notStored // declared past the replay: they escape, allocations
	var pe *idem.PanicError
	switch {
	case errors.As(err, &ns) && ns.complete:
		g.replay(w, req, ns.resp, lk) // the shared execution's outcome, not kept for later
	case errors.As(err, &ns):
		g.fail(w, req, http.StatusConflict, "The request with this Idempotency-Key ended with a response that was not kept (streamed, or written after it); retry with the same key.", g.opts.RetryAfter, err)
	case errors.As(err, &pe) || errors.Is(err, idem.ErrGoexit):
		g.fail(w, req, http.StatusInternalServerError, "The request failed; it may be retried with the same key.", 0, err)
	case errors.Is(err, errOverQuota):
		// A client can cause this at will: Debug, never a log flood.
		g.opts.Logger.Debug("idemhttp: scope over its quota; request refused", lk.with()...)
		g.fail(w, req, http.StatusTooManyRequests, "This client has made as many new requests as it may for now; retry later with the same key.", g.quota.RetryAfter(scope), err)
	case errors.Is(err, idem.ErrPayloadMismatch):
		g.fail(w, req, http.StatusUnprocessableEntity, "This Idempotency-Key was used with a different request.", 0, err)
	case errors.Is(err, idem.ErrInProgress):
		g.fail(w, req, http.StatusConflict, "A request with this Idempotency-Key is still being processed; retry with the same key.", g.opts.RetryAfter, err)
	case errors.Is(err, idem.ErrOutcomeUnknown):
		// Not 409: retrying cannot help until an operator reconciles the key.
		g.fail(w, req, http.StatusInternalServerError, "A request with this Idempotency-Key was interrupted and its outcome is unknown; it needs an operator.", 0, err)
	case errors.Is(err, idem.ErrInvalidKey):
		g.fail(w, req, http.StatusBadRequest, "Malformed Idempotency-Key: "+err.Error(), 0, err)
	case errors.Is(err, idem.ErrFull):
		// A client can cause this at will: Debug, never a log flood.
		g.opts.Logger.Debug("idemhttp: store full; request refused", lk.with("err", err)...)
		g.fail(w, req, http.StatusServiceUnavailable, "The server holds as many requests in flight as it can track; retry later with the same key.", g.opts.RetryAfter, err)
	case idem.IsFinal(err):
		// A final error recorded for the key: never the middleware's own
		// (it records responses), but an operator's (idem resolve -error,
		// Store.Resolve). Its message is theirs, not the client's; and a
		// client can ask again at will: Debug.
		g.opts.Logger.Debug("idemhttp: the key's recorded outcome is a final error", lk.with("err", err)...)
		g.fail(w, req, http.StatusInternalServerError, "The request with this Idempotency-Key ended in a final error; it will not run again.", 0, err)
	case g.opts.FailOpen && g.opts.InTx == nil && isClaimFailure(err):
		g.opts.Logger.Warn("idemhttp: store unavailable; running the handler unguarded (FailOpen)", lk.with("err", err)...)
		next.ServeHTTP(w, req)
	default:
		g.opts.Logger.Error("idemhttp: store unavailable", lk.with("err", err)...)
		g.fail(w, req, http.StatusServiceUnavailable, "Idempotency keys cannot be checked right now; retry with the same key.", g.opts.RetryAfter, err)
	}
}

// fail answers status through Options.WriteError, with Retry-After set
// first when retryAfter is positive.
func (g *Guard) fail(w http.ResponseWriter, r *http.Request, status int, detail string, retryAfter time.Duration, cause error) {
	if retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.FormatInt(seconds(retryAfter), 10))
	}
	g.opts.WriteError(w, r, Problem{Status: status, Detail: detail, Err: cause})
}

// seconds is d in whole seconds, rounded up, at least 1 (d > 0), without
// overflowing for the longest d.
func seconds(d time.Duration) int64 {
	s := int64(d / time.Second)
	if d%time.Second != 0 {
		s++
	}
	return max(s, 1)
}

// errOverQuota releases a key claimed by a scope over its quota.
var errOverQuota = errors.New("idemhttp: the scope has made as many new keys as its quota allows")

// ErrNoCredentials is what an Options.Scope returns, or wraps, when the
// request carries no credentials to name its client by: the middleware
// answers it 401, a client's mistake, rather than 500.
var ErrNoCredentials = errors.New("idemhttp: the request carries no credentials")

// errEmptyScope is the cause of the 500 for a Scope that returned "".
var errEmptyScope = errors.New("idemhttp: Options.Scope returned an empty scope")

// isClaimFailure reports whether err says the backend could not claim the
// key, so that nothing ran and nothing was read: the one failure FailOpen
// may step around.
func isClaimFailure(err error) bool {
	var be *idem.BackendError
	return errors.As(err, &be) && be.Op == "claim"
}

// StoreKey returns the key under which the middleware keeps a request's
// outcome when Options.Scope is set: scope and the Idempotency-Key joined
// so that no other pair gives the same result, the empty scope included
// (the scope's length, ":", the scope, ":", the key, as in
// "10:acct-alice:curl-key-1"). One that idem would not accept, being too
// long or holding control characters, is "sha256:" and the hex of its
// SHA-256. Operators use it to find a request's record (idem show -scope).
// Without Options.Scope the scope is empty ("0::key"): Scope never gives
// an empty scope, so a key sent to an unscoped route, whatever its shape,
// never names a scoped route's record.
func StoreKey(scope, key string) string {
	k := strconv.Itoa(len(scope)) + ":" + scope + ":" + key
	if idem.CheckKey(k) == nil {
		return k
	}
	sum := sha256.Sum256([]byte(k))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// logKey is what a log line says of the request it is about: its key (or
// the key's hash, with Options.HashKeysInLogs) and scope. It is built only
// when a line is logged.
type logKey struct {
	g          *Guard
	scope, key string
}

// with returns the request's attributes followed by more. With
// Options.HashKeysInLogs, an error among more is logged as its text with
// the store key in it, as backends name it in their errors (quoted or
// not), replaced by the key's hash: the key itself is never logged.
func (lk logKey) with(more ...any) []any {
	attrs := make([]any, 0, 4+len(more))
	if lk.g.opts.HashKeysInLogs {
		sum := sha256.Sum256([]byte(lk.key))
		hash := hex.EncodeToString(sum[:])
		attrs = append(attrs, "key_sha256", hash)
		for i, v := range more {
			if err, ok := v.(error); ok && err != nil {
				more[i] = hideKey(err.Error(), StoreKey(lk.scope, lk.key), lk.key, hash)
			}
		}
	} else {
		attrs = append(attrs, "key", lk.key)
	}
	attrs = append(attrs, "scope", lk.scope)
	return append(attrs, more...)
}

// hideKey returns msg with storeKey (and key, where it is quoted) replaced
// by "key_sha256:" and hash, in each form an error may hold it: as it is,
// and quoted by %q, once or more (an error quoted into another's message).
// The bare key is replaced only where it is quoted, its quotes included,
// not wherever its bytes occur: a short key would otherwise mangle the
// message. The forms are replaced in one pass, the longest first, so that
// no replacement is replaced again (a short key's bytes may occur in the
// hash, or in "key_sha256").
func hideKey(msg, storeKey, key, hash string) string {
	forms := []string{storeKey}
	q := storeKey
	for range 3 {
		q = strconv.Quote(q)
		forms = append(forms, q[1:len(q)-1])
	}
	q = strconv.Quote(key)
	forms = append(forms, q) // quoted once: the quotes are its own
	for range 2 {
		q = strconv.Quote(q)
		forms = append(forms, q[1:len(q)-1])
	}
	slices.SortStableFunc(forms, func(a, b string) int { return len(b) - len(a) })
	forms = slices.Compact(forms)
	pairs := make([]string, 0, 2*len(forms))
	for _, f := range forms {
		pairs = append(pairs, f, "key_sha256:"+hash)
	}
	return strings.NewReplacer(pairs...).Replace(msg)
}
