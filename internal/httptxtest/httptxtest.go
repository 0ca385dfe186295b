// Package httptxtest is the behaviour suite of idemhttp's transactional
// mode (Options.InTx) that every backend giving an InTx (postgres, mysql,
// sqlite) must pass: a handler's rows, its key and its response commit
// together before the response is sent, or none of them does and the key
// is free. Each backend's tests run it with a Harness, as they run
// internal/txtest for RunOnceTx.
package httptxtest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemhttp"
	"github.com/seed094d4201/idem/internal/txrun"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// InTx is the shape of a backend package's InTx[idemhttp.Response].
type InTx = func(ctx context.Context, store *idem.Store[idemhttp.Response], key string, payload any, fn func(ctx context.Context) (idemhttp.Response, error)) (idemhttp.Response, error)

// A Harness adapts one backend to the suite.
type Harness struct {
	// New returns a Fixture over a fresh set of tables (the store's and
	// the handler's charges) in a database of the backend's; the stores
	// it makes are closed when the test ends.
	New func(t *testing.T, opts idem.Options) *Fixture

	// InTx is the backend package's InTx[idemhttp.Response].
	InTx InTx

	// SelfCommitKeeps is the backend's documented answer to a handler
	// that commits its transaction itself: its rows commit with the claim,
	// and the key is left interrupted (MySQL). False: nothing commits
	// (PostgreSQL's savepoint, SQLite's refused commit).
	SelfCommitKeeps bool
}

// A Fixture is one store over fresh tables, and the handler's side of
// them.
type Fixture struct {
	Store *idem.Store[idemhttp.Response]

	// Second returns another store over the same tables, through a
	// connection pool of its own, as a second process would have.
	Second func(t *testing.T, opts idem.Options) *idem.Store[idemhttp.Response]

	// Charge inserts one charge row through the transaction the
	// backend's TxFromContext finds in ctx, and returns its id.
	Charge func(ctx context.Context) (int64, error)

	// Charges counts the charge rows committed.
	Charges func() int

	// EndTx commits (commit) or rolls back the transaction the backend's
	// TxFromContext finds in ctx, as a handler must not.
	EndTx func(ctx context.Context, commit bool) error
}

// Run runs the suite.
func Run(t *testing.T, h Harness) {
	for _, tc := range []struct {
		name string
		test func(*testing.T, Harness)
	}{
		{"SuccessCommitsAndRetryReplaysByteForByte", testSuccess},
		{"DifferentPayloadIs422", testPayloadMismatch},
		{"HeadersAsNetHTTPSendsThem", testHeadersAsSent},
		{"FlushIsRefusedAtOnce", testFlush},
		{"FlushErrorIsRefusedAtOnce", testFlushError},
		{"HijackIsRefused", testHijack},
		{"OversizedBodyIsRefused", testOversized},
		{"HandlerCommitsItsTx", func(t *testing.T, h Harness) { testEndsItsTx(t, h, true) }},
		{"HandlerRollsItsTxBack", func(t *testing.T, h Harness) { testEndsItsTx(t, h, false) }},
		{"ServerErrorIsDeliveredAndRolledBack", testServerError},
		{"PanicIs500AndRolledBack", testPanic},
		{"GoexitIs500AndRolledBack", testGoexit},
		{"ClientHangUpDoesNotStopTheCommit", testHangUp},
		{"ExecutionTimeoutRollsBackWith503", testExecutionTimeout},
		{"DuplicateWaitsThenReplays", func(t *testing.T, h Harness) { testDuplicateWaits(t, h, false) }},
		{"DuplicateFromSecondStoreWaitsThenReplays", func(t *testing.T, h Harness) { testDuplicateWaits(t, h, true) }},
		{"DuplicateOfARollbackGetsItsAnswer", func(t *testing.T, h Harness) { testDuplicateOfRollback(t, h, false) }},
		{"DuplicateFromSecondStoreOfARollbackRunsItself", func(t *testing.T, h Harness) { testDuplicateOfRollback(t, h, true) }},
		{"DuplicateOfARefusedRequestIsToldToRetry", testDuplicateOfRefused},
		{"DuplicateIs409AfterWait", func(t *testing.T, h Harness) { testDuplicate409(t, h, false) }},
		{"DuplicateFromSecondStoreIs409AfterWait", func(t *testing.T, h Harness) { testDuplicate409(t, h, true) }},
		{"DuplicateThatGaveUpDoesNotRunAfterRollback", func(t *testing.T, h Harness) { testGaveUp(t, h, false) }},
		{"DuplicateFromSecondStoreThatGaveUpDoesNotRunAfterRollback", func(t *testing.T, h Harness) { testGaveUp(t, h, true) }},
		{"ScopeQuotaIs429AndGivesTheKeyBack", testQuota},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.test(t, h) })
	}
}

// A server is the middleware in the transactional mode over one store,
// guarding a handler that is told which run of it this is (1, 2, ...).
type server struct {
	*httptest.Server
	runs atomic.Int32
}

// handler is a guarded handler; run counts its runs on the server, from 1.
type handler func(run int32, w http.ResponseWriter, r *http.Request)

// serve starts a real TCP server with the middleware in the
// transactional mode over store. waiting, if not nil, is called when a
// request's claim of its key first looks at its context's Done channel,
// which it does as it starts waiting: a duplicate in this process then
// has the owner's execution in hand, and gets its outcome however soon
// that comes; one whose claim is its process's waits on the database.
func serve(t *testing.T, h Harness, store *idem.Store[idemhttp.Response], opts idemhttp.Options, waiting func(), next handler) *server {
	t.Helper()
	opts.InTx = h.InTx
	if waiting != nil {
		opts.InTx = func(ctx context.Context, s *idem.Store[idemhttp.Response], key string, payload any, fn func(context.Context) (idemhttp.Response, error)) (idemhttp.Response, error) {
			return h.InTx(&doneWatch{Context: ctx, watched: waiting}, s, key, payload, fn)
		}
	}
	if opts.Scope == nil {
		opts.Unscoped = true
	}
	if opts.Logger == nil {
		opts.Logger = quiet()
	}
	s := &server{}
	guarded := idemhttp.Middleware(store, opts)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next(s.runs.Add(1), w, r)
	}))
	s.Server = httptest.NewServer(guarded)
	t.Cleanup(s.Close)
	return s
}

// A doneWatch is a context that calls watched the first time its Done
// channel is asked for.
type doneWatch struct {
	context.Context
	once    sync.Once
	watched func()
}

func (c *doneWatch) Done() <-chan struct{} {
	c.once.Do(c.watched)
	return c.Context.Done()
}

// A reply is a response read whole.
type reply struct {
	*http.Response
	body string
}

// post sends a POST of body with the Idempotency-Key key, under ctx.
func post(ctx context.Context, url, key, body string) (reply, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return reply{}, err
	}
	req.Header.Set(idemhttp.Header, key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return reply{resp, string(b)}, err
}

func mustPost(t *testing.T, url, key, body string) reply {
	t.Helper()
	r, err := post(context.Background(), url, key, body)
	require.NoError(t, err)
	return r
}

// postAsync sends post on a goroutine of its own; the reply comes on the
// channel.
func postAsync(url, key, body string) <-chan reply {
	c := make(chan reply, 1)
	go func() {
		r, err := post(context.Background(), url, key, body)
		if err != nil {
			r = reply{Response: &http.Response{StatusCode: -1}, body: err.Error()}
		}
		c <- r
	}()
	return c
}

// keyState is the state of the record of the unscoped Idempotency-Key key
// in s's Backend, or "free".
func keyState(t *testing.T, s *idem.Store[idemhttp.Response], key string) string {
	t.Helper()
	opts := txrun.Of(s).Options()
	rec, ok, err := opts.Backend.Get(context.Background(), idemhttp.StoreKey("", key), opts.Now())
	require.NoError(t, err)
	if !ok {
		return "free"
	}
	return rec.State.String()
}

// charge is the well-behaved handler: it inserts a charge row through
// its transaction and answers 201 with the charge, a Location, and a
// cookie, which goes to the first client and is never replayed.
func charge(f *Fixture) handler {
	return func(_ int32, w http.ResponseWriter, r *http.Request) {
		id, err := f.Charge(r.Context())
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", fmt.Sprintf("/charges/%d", id))
		w.Header().Set("X-Custom", "stored")
		w.Header().Set("Set-Cookie", "session=secret")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"charge":%d,"request":%q}`, id, body)
	}
}

// firstThen runs first on the handler's first run and then on every later
// one.
func firstThen(first, then handler) handler {
	return func(run int32, w http.ResponseWriter, r *http.Request) {
		if run == 1 {
			first(run, w, r)
			return
		}
		then(run, w, r)
	}
}

// isFirstAnswer checks a 201 from charge that is not a replay.
func isFirstAnswer(t *testing.T, r reply) {
	t.Helper()
	assert.Equal(t, http.StatusCreated, r.StatusCode, r.body)
	assert.Empty(t, r.Header.Get(idemhttp.ReplayedHeader))
	assert.Equal(t, "session=secret", r.Header.Get("Set-Cookie"))
	assert.Contains(t, r.body, `{"charge":`)
}

// isReplayOf checks that replay is first replayed byte for byte: its
// status, stored headers and body, marked as a replay, without the cookie.
func isReplayOf(t *testing.T, first, replay reply) {
	t.Helper()
	assert.Equal(t, first.StatusCode, replay.StatusCode)
	assert.Equal(t, first.body, replay.body, "the body, byte for byte")
	for _, name := range []string{"Content-Type", "Location", "X-Custom"} {
		assert.Equal(t, first.Header.Values(name), replay.Header.Values(name), name)
	}
	assert.Equal(t, "true", replay.Header.Get(idemhttp.ReplayedHeader))
	assert.Empty(t, replay.Header.Values("Set-Cookie"), "a cookie is never replayed")
}

// isRolledBack checks that a request left nothing: no charge, the key
// free, and that the retry runs the handler afresh and commits.
func isRolledBack(t *testing.T, f *Fixture, srv *server, key, body string) {
	t.Helper()
	assert.Equal(t, 0, f.Charges(), "the handler's rows were rolled back")
	assert.Equal(t, "free", keyState(t, f.Store, key), "and the key is free")
	runs := srv.runs.Load()
	retry := mustPost(t, srv.URL, key, body)
	isFirstAnswer(t, retry)
	assert.Equal(t, runs+1, srv.runs.Load(), "the retry ran the handler")
	assert.Equal(t, 1, f.Charges())
	assert.Equal(t, "completed", keyState(t, f.Store, key))
}

func testSuccess(t *testing.T, h Harness) {
	f := h.New(t, idem.Options{})
	srv := serve(t, h, f.Store, idemhttp.Options{}, nil, charge(f))
	first := mustPost(t, srv.URL, "pay-1", `{"amount":1250}`)
	isFirstAnswer(t, first)
	assert.Equal(t, 1, f.Charges(), "the handler's row")
	assert.Equal(t, "completed", keyState(t, f.Store, "pay-1"), "and the key, with its response")
	for range 2 {
		isReplayOf(t, first, mustPost(t, srv.URL, "pay-1", `{"amount":1250}`))
	}
	// From a second store, as another process would: the response was
	// committed to the database, not only kept in this one's memory.
	other := serve(t, h, f.Second(t, idem.Options{}), idemhttp.Options{}, nil, charge(f))
	isReplayOf(t, first, mustPost(t, other.URL, "pay-1", `{"amount":1250}`))
	assert.Equal(t, int32(1), srv.runs.Load())
	assert.Zero(t, other.runs.Load())
	assert.Equal(t, 1, f.Charges())
}

func testPayloadMismatch(t *testing.T, h Harness) {
	f := h.New(t, idem.Options{})
	srv := serve(t, h, f.Store, idemhttp.Options{}, nil, charge(f))
	isFirstAnswer(t, mustPost(t, srv.URL, "pay-1", `{"amount":1250}`))
	r := mustPost(t, srv.URL, "pay-1", `{"amount":9999}`)
	assert.Equal(t, http.StatusUnprocessableEntity, r.StatusCode, r.body)
	assert.Equal(t, int32(1), srv.runs.Load())
	assert.Equal(t, 1, f.Charges())
}

// testHeadersAsSent: the response held until the commit goes out as
// net/http would have sent it unheld, and as it is replayed: a header set
// after WriteHeader is not sent, and a declared trailer is a trailer, not
// a header too.
func testHeadersAsSent(t *testing.T, h Harness) {
	f := h.New(t, idem.Options{})
	srv := serve(t, h, f.Store, idemhttp.Options{}, nil, func(_ int32, w http.ResponseWriter, r *http.Request) {
		if _, err := f.Charge(r.Context()); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Trailer", "X-Sum")
		w.Header().Set("X-Early", "sent")
		w.WriteHeader(http.StatusCreated)
		w.Header().Set("X-Late", "set after WriteHeader")
		_, _ = io.WriteString(w, "charged")
		w.Header().Set("X-Sum", "c0ffee")
	})
	for i, r := range []reply{mustPost(t, srv.URL, "k", "p"), mustPost(t, srv.URL, "k", "p")} {
		assert.Equal(t, http.StatusCreated, r.StatusCode, r.body)
		assert.Equal(t, "charged", r.body)
		assert.Equal(t, "sent", r.Header.Get("X-Early"), "response %d", i)
		assert.Empty(t, r.Header.Values("X-Late"), "response %d: net/http ignores a header set after WriteHeader", i)
		assert.Empty(t, r.Header.Values("X-Sum"), "response %d: the trailer is not a header", i)
		assert.Equal(t, "c0ffee", r.Trailer.Get("X-Sum"), "response %d", i)
	}
	assert.Equal(t, int32(1), srv.runs.Load())
}

// refusedRun is a first run that charges, then does what cannot be held;
// the call's error (nil for one that returns none) comes on errs, and
// that of a write after it on writes.
func refusedRun(f *Fixture, errs, writes chan<- error, misbehave func(w http.ResponseWriter) error) handler {
	return func(_ int32, w http.ResponseWriter, r *http.Request) {
		if _, err := f.Charge(r.Context()); err != nil {
			errs <- fmt.Errorf("charge: %w", err)
			return
		}
		w.Header().Set("X-Handler", "refused")
		errs <- misbehave(w)
		_, err := io.WriteString(w, "more")
		writes <- err
	}
}

// isRefused checks a request whose response could not be held: 500, none
// of the handler's headers, nothing kept, and the retry runs.
func isRefused(t *testing.T, f *Fixture, srv *server, r reply, key string) {
	t.Helper()
	assert.Equal(t, http.StatusInternalServerError, r.StatusCode, r.body)
	assert.Empty(t, r.Header.Get("X-Handler"), "the handler's headers belong to a response never sent")
	assert.NotContains(t, r.body, "more")
	isRolledBack(t, f, srv, key, "p")
}

func testFlush(t *testing.T, h Harness) {
	f := h.New(t, idem.Options{})
	errs, writes := make(chan error, 1), make(chan error, 1)
	flushed := make(chan bool, 1)
	srv := serve(t, h, f.Store, idemhttp.Options{}, nil, firstThen(refusedRun(f, errs, writes, func(w http.ResponseWriter) error {
		_, _ = io.WriteString(w, "part")
		fl, ok := w.(http.Flusher)
		flushed <- ok
		if ok {
			fl.Flush()
		}
		return nil
	}), charge(f)))
	r := mustPost(t, srv.URL, "k", "p")
	require.True(t, <-flushed, "the writer is an http.Flusher")
	require.NoError(t, <-errs) // Flush has no error to return
	assert.Error(t, <-writes, "a write after the refused Flush fails: the handler is told at once")
	assert.NotContains(t, r.body, "part")
	isRefused(t, f, srv, r, "k")
}

func testFlushError(t *testing.T, h Harness) {
	f := h.New(t, idem.Options{})
	errs, writes := make(chan error, 1), make(chan error, 1)
	srv := serve(t, h, f.Store, idemhttp.Options{}, nil, firstThen(refusedRun(f, errs, writes, func(w http.ResponseWriter) error {
		_, _ = io.WriteString(w, "part")
		return http.NewResponseController(w).Flush()
	}), charge(f)))
	r := mustPost(t, srv.URL, "k", "p")
	assert.Error(t, <-errs, "FlushError fails at once")
	assert.Error(t, <-writes)
	assert.NotContains(t, r.body, "part")
	isRefused(t, f, srv, r, "k")
}

func testHijack(t *testing.T, h Harness) {
	f := h.New(t, idem.Options{})
	errs, writes := make(chan error, 1), make(chan error, 1)
	srv := serve(t, h, f.Store, idemhttp.Options{}, nil, firstThen(refusedRun(f, errs, writes, func(w http.ResponseWriter) error {
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Close()
		}
		return err
	}), charge(f)))
	r := mustPost(t, srv.URL, "k", "p")
	assert.Error(t, <-errs, "Hijack fails")
	assert.Error(t, <-writes, "and so does every write after it")
	isRefused(t, f, srv, r, "k")
}

func testOversized(t *testing.T, h Harness) {
	f := h.New(t, idem.Options{})
	const max = 64
	writes := make(chan error, 2)
	srv := serve(t, h, f.Store, idemhttp.Options{MaxStoredBody: max}, nil, firstThen(func(_ int32, w http.ResponseWriter, r *http.Request) {
		if _, err := f.Charge(r.Context()); err != nil {
			writes <- err
			return
		}
		w.Header().Set("X-Handler", "refused")
		_, err := io.WriteString(w, strings.Repeat("a", max)) // fits
		writes <- err
		_, err = io.WriteString(w, "b") // one byte past it
		writes <- err
	}, charge(f)))
	r := mustPost(t, srv.URL, "k", "p")
	require.NoError(t, <-writes, "a body of MaxStoredBody bytes is held")
	assert.Error(t, <-writes, "the write past MaxStoredBody fails")
	assert.NotContains(t, r.body, "aaaa")
	isRefused(t, f, srv, r, "k")
}

// testEndsItsTx: a handler that commits (or rolls back) its transaction
// itself gets the backend's documented answer.
func testEndsItsTx(t *testing.T, h Harness, commit bool) {
	f := h.New(t, idem.Options{})
	srv := serve(t, h, f.Store, idemhttp.Options{}, nil, firstThen(func(_ int32, w http.ResponseWriter, r *http.Request) {
		if _, err := f.Charge(r.Context()); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		_ = f.EndTx(r.Context(), commit) // its error is the backend's, and ignored as a careless handler would
		w.Header().Set("X-Handler", "ended")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "charged")
	}, charge(f)))
	r := mustPost(t, srv.URL, "k", "p")
	assert.Empty(t, r.Header.Get("X-Handler"))
	assert.NotContains(t, r.body, "charged")
	if !commit || !h.SelfCommitKeeps {
		assert.Equal(t, http.StatusServiceUnavailable, r.StatusCode, "nothing was committed: %s", r.body)
		isRolledBack(t, f, srv, "k", "p")
		return
	}
	// MySQL: the COMMIT took the row and the claim, whose lease had lapsed
	// already, with no outcome: the key is interrupted, and the request is
	// told so, as its retries are, not that nothing was saved.
	assert.Equal(t, http.StatusInternalServerError, r.StatusCode, r.body)
	assert.Contains(t, r.body, "outcome is unknown")
	assert.Empty(t, r.Header.Get("Retry-After"), "retrying cannot help until an operator settles the key")
	assert.Equal(t, 1, f.Charges(), "the handler's COMMIT kept its row")
	assert.Equal(t, "interrupted", keyState(t, f.Store, "k"), "with a claim that has no outcome")
	retry := mustPost(t, srv.URL, "k", "p")
	assert.Equal(t, http.StatusInternalServerError, retry.StatusCode, retry.body)
	assert.Contains(t, retry.body, "outcome is unknown")
	assert.Equal(t, int32(1), srv.runs.Load(), "the retry did not run the handler")
	assert.Equal(t, 1, f.Charges())
}

func testServerError(t *testing.T, h Harness) {
	f := h.New(t, idem.Options{})
	srv := serve(t, h, f.Store, idemhttp.Options{}, nil, firstThen(func(_ int32, w http.ResponseWriter, r *http.Request) {
		if _, err := f.Charge(r.Context()); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("X-Handler", "bank")
		w.WriteHeader(http.StatusBadGateway)
		_, _ = io.WriteString(w, "bank down")
	}, charge(f)))
	r := mustPost(t, srv.URL, "k", "p")
	assert.Equal(t, http.StatusBadGateway, r.StatusCode, "delivered as written")
	assert.Equal(t, "bank down", r.body)
	assert.Equal(t, "bank", r.Header.Get("X-Handler"))
	assert.Empty(t, r.Header.Get(idemhttp.ReplayedHeader))
	isRolledBack(t, f, srv, "k", "p")
}

func testPanic(t *testing.T, h Harness) {
	f := h.New(t, idem.Options{})
	srv := serve(t, h, f.Store, idemhttp.Options{}, nil, firstThen(func(_ int32, w http.ResponseWriter, r *http.Request) {
		if _, err := f.Charge(r.Context()); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("X-Handler", "panicked")
		w.WriteHeader(http.StatusCreated)
		panic("bug in the handler")
	}, charge(f)))
	r := mustPost(t, srv.URL, "k", "p")
	assert.Equal(t, http.StatusInternalServerError, r.StatusCode, r.body)
	assert.Empty(t, r.Header.Get("X-Handler"))
	isRolledBack(t, f, srv, "k", "p")
}

// A handler that ends its goroutine (runtime.Goexit, as t.FailNow does)
// returns no response: its rows roll back with the claim, and the request
// is answered as one whose handler panicked, 500, as without InTx.
func testGoexit(t *testing.T, h Harness) {
	f := h.New(t, idem.Options{})
	srv := serve(t, h, f.Store, idemhttp.Options{}, nil, firstThen(func(_ int32, w http.ResponseWriter, r *http.Request) {
		if _, err := f.Charge(r.Context()); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("X-Handler", "exited")
		w.WriteHeader(http.StatusCreated)
		runtime.Goexit()
	}, charge(f)))
	r := mustPost(t, srv.URL, "k", "p")
	assert.Equal(t, http.StatusInternalServerError, r.StatusCode, r.body)
	assert.Empty(t, r.Header.Get("X-Handler"))
	isRolledBack(t, f, srv, "k", "p")
}

// blocked is a first run that charges, says so on started, and answers
// only once release is closed: 201 through charge's answer, or fail's
// status if fail is set.
func blocked(f *Fixture, started chan<- struct{}, release <-chan struct{}, fail int) handler {
	return func(run int32, w http.ResponseWriter, r *http.Request) {
		id, err := f.Charge(r.Context())
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		close(started)
		<-release
		if fail != 0 {
			http.Error(w, "failed", fail)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", fmt.Sprintf("/charges/%d", id))
		w.Header().Set("X-Custom", "stored")
		w.Header().Set("Set-Cookie", "session=secret")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"charge":%d,"request":"p"}`, id)
	}
}

func testHangUp(t *testing.T, h Harness) {
	f := h.New(t, idem.Options{})
	started, release := make(chan struct{}), make(chan struct{})
	srv := serve(t, h, f.Store, idemhttp.Options{}, nil, firstThen(blocked(f, started, release, 0), charge(f)))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := post(ctx, srv.URL, "k", "p")
		done <- err
	}()
	<-started
	cancel() // the client hangs up while the handler runs
	assert.Error(t, <-done)
	close(release)
	retry := mustPost(t, srv.URL, "k", "p") // waits for the first's commit if it is still under way
	assert.Equal(t, http.StatusCreated, retry.StatusCode, retry.body)
	assert.Equal(t, "true", retry.Header.Get(idemhttp.ReplayedHeader), "the retry replays the committed response")
	assert.Equal(t, int32(1), srv.runs.Load())
	assert.Equal(t, 1, f.Charges(), "one row")
	assert.Equal(t, "completed", keyState(t, f.Store, "k"))
}

// A handler still running at the store's ExecutionTimeout: its context
// ends, its transaction is rolled back, and the request is answered 503
// whatever the handler writes after.
func testExecutionTimeout(t *testing.T, h Harness) {
	f := h.New(t, idem.Options{ExecutionTimeout: 2 * time.Second})
	srv := serve(t, h, f.Store, idemhttp.Options{}, nil, firstThen(func(_ int32, w http.ResponseWriter, r *http.Request) {
		if _, err := f.Charge(r.Context()); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		<-r.Context().Done() // the timeout ends the handler's run
		w.Header().Set("X-Handler", "late")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "charged late")
	}, charge(f)))
	r := mustPost(t, srv.URL, "k", "p")
	assert.Equal(t, http.StatusServiceUnavailable, r.StatusCode, r.body)
	assert.NotEmpty(t, r.Header.Get("Retry-After"))
	assert.Empty(t, r.Header.Get("X-Handler"))
	assert.NotContains(t, r.body, "charged late")
	isRolledBack(t, f, srv, "k", "p")
}

// duplicates returns the server a duplicate is sent to: srv itself, or
// one over a second store on the same tables; waiting hears of each
// request's wait for its key there (see serve).
func duplicates(t *testing.T, h Harness, f *Fixture, second bool, opts idemhttp.Options, waiting func()) *server {
	if !second {
		// The duplicate's own options need their own guard over the same store.
		return serve(t, h, f.Store, opts, waiting, charge(f))
	}
	return serve(t, h, f.Second(t, idem.Options{}), opts, waiting, charge(f))
}

// testDuplicateWaits: a duplicate that arrives while the first request's
// transaction is open waits for it and replays its response.
func testDuplicateWaits(t *testing.T, h Harness, second bool) {
	f := h.New(t, idem.Options{})
	started, release := make(chan struct{}), make(chan struct{})
	srv := serve(t, h, f.Store, idemhttp.Options{}, nil, blocked(f, started, release, 0))
	waiting := make(chan struct{}, 1)
	dupSrv := duplicates(t, h, f, second, idemhttp.Options{}, func() { waiting <- struct{}{} })
	first := postAsync(srv.URL, "k", "p")
	<-started
	dup := postAsync(dupSrv.URL, "k", "p")
	<-waiting // with the first's transaction still open
	assert.Equal(t, 0, f.Charges(), "nothing is committed before the response is ready")
	close(release)
	r1, r2 := <-first, <-dup
	isFirstAnswer(t, r1)
	isReplayOf(t, r1, r2)
	assert.Equal(t, int32(1), srv.runs.Load()+dupSrv.runs.Load(), "the handler ran once")
	assert.Equal(t, 1, f.Charges())
}

// testDuplicateOfRollback: a duplicate waiting while the first's
// transaction is open, which then rolls back (a 5xx): one in the same
// process is answered as the first was, its 5xx replayed, and the key is
// free; one in another process, whose claim waited on the database, finds
// the key free and runs the handler itself.
func testDuplicateOfRollback(t *testing.T, h Harness, second bool) {
	f := h.New(t, idem.Options{})
	started, release := make(chan struct{}), make(chan struct{})
	srv := serve(t, h, f.Store, idemhttp.Options{}, nil, firstThen(blocked(f, started, release, http.StatusBadGateway), charge(f)))
	waiting := make(chan struct{}, 1)
	dupSrv := duplicates(t, h, f, second, idemhttp.Options{}, func() { waiting <- struct{}{} })
	first := postAsync(srv.URL, "k", "p")
	<-started
	dup := postAsync(dupSrv.URL, "k", "p")
	<-waiting
	close(release)
	r1, r2 := <-first, <-dup
	assert.Equal(t, http.StatusBadGateway, r1.StatusCode, r1.body)
	if !second {
		assert.Equal(t, http.StatusBadGateway, r2.StatusCode, r2.body)
		assert.Equal(t, r1.body, r2.body)
		assert.Equal(t, "true", r2.Header.Get(idemhttp.ReplayedHeader), "the first's answer")
		assert.Zero(t, dupSrv.runs.Load())
		isRolledBack(t, f, srv, "k", "p")
		return
	}
	isFirstAnswer(t, r2)
	assert.Equal(t, int32(1), dupSrv.runs.Load(), "the duplicate ran the handler itself")
	assert.Equal(t, 1, f.Charges())
	assert.Equal(t, "completed", keyState(t, f.Store, "k"))
}

// testDuplicateOfRefused: a duplicate waiting in the same process on a
// request whose response was refused (it flushed) or whose handler
// panicked is told to retry (503, or 500 for the panic): nothing of the
// first was kept, and the key is free.
func testDuplicateOfRefused(t *testing.T, h Harness) {
	for _, tc := range []struct {
		name   string
		end    func(w http.ResponseWriter)
		status int
	}{
		{"Flush", func(w http.ResponseWriter) { _ = http.NewResponseController(w).Flush() }, http.StatusServiceUnavailable},
		{"Panic", func(http.ResponseWriter) { panic("bug in the handler") }, http.StatusInternalServerError},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := h.New(t, idem.Options{})
			started, release := make(chan struct{}), make(chan struct{})
			srv := serve(t, h, f.Store, idemhttp.Options{}, nil, firstThen(func(_ int32, w http.ResponseWriter, r *http.Request) {
				if _, err := f.Charge(r.Context()); err != nil {
					http.Error(w, err.Error(), http.StatusInternalServerError)
					return
				}
				close(started)
				<-release
				tc.end(w)
			}, charge(f)))
			waiting := make(chan struct{}, 1)
			dupSrv := duplicates(t, h, f, false, idemhttp.Options{}, func() { waiting <- struct{}{} })
			first := postAsync(srv.URL, "k", "p")
			<-started
			dup := postAsync(dupSrv.URL, "k", "p")
			<-waiting
			close(release)
			r1, r2 := <-first, <-dup
			assert.Equal(t, http.StatusInternalServerError, r1.StatusCode, r1.body)
			assert.Equal(t, tc.status, r2.StatusCode, r2.body)
			assert.NotContains(t, r2.body, "cannot be checked", "the store did not fail: the first request did")
			assert.Zero(t, dupSrv.runs.Load())
			isRolledBack(t, f, srv, "k", "p")
		})
	}
}

// testDuplicate409: a duplicate whose Options.Wait ends while the first's
// transaction is still open is answered 409 with Retry-After; the first
// commits, and a later retry replays it.
func testDuplicate409(t *testing.T, h Harness, second bool) {
	f := h.New(t, idem.Options{})
	started, release := make(chan struct{}), make(chan struct{})
	srv := serve(t, h, f.Store, idemhttp.Options{}, nil, blocked(f, started, release, 0))
	dupSrv := duplicates(t, h, f, second, idemhttp.Options{Wait: 50 * time.Millisecond}, nil)
	first := postAsync(srv.URL, "k", "p")
	<-started
	dup := mustPost(t, dupSrv.URL, "k", "p") // the first holds its transaction until this is answered
	assert.Equal(t, http.StatusConflict, dup.StatusCode, dup.body)
	assert.NotEmpty(t, dup.Header.Get("Retry-After"))
	close(release)
	r1 := <-first
	isFirstAnswer(t, r1)
	isReplayOf(t, r1, mustPost(t, dupSrv.URL, "k", "p"))
	assert.Equal(t, int32(1), srv.runs.Load())
	assert.Zero(t, dupSrv.runs.Load())
	assert.Equal(t, 1, f.Charges())
}

// testGaveUp: a duplicate whose wait ended (409) before the first's
// transaction did, when the first then rolls back, does not run the
// handler: from a second store its claim goes on in the background, wins
// the key once the first's transaction ends, and gives it back unrun. The
// key is free for the client's retry.
func testGaveUp(t *testing.T, h Harness, second bool) {
	f := h.New(t, idem.Options{})
	started, release := make(chan struct{}), make(chan struct{})
	srv := serve(t, h, f.Store, idemhttp.Options{}, nil, firstThen(blocked(f, started, release, http.StatusBadGateway), charge(f)))
	dupStore := f.Store
	if second {
		dupStore = f.Second(t, idem.Options{})
	}
	dupSrv := serve(t, h, dupStore, idemhttp.Options{Wait: 50 * time.Millisecond}, nil, charge(f))
	first := postAsync(srv.URL, "k", "p")
	<-started
	dup := mustPost(t, dupSrv.URL, "k", "p")
	assert.Equal(t, http.StatusConflict, dup.StatusCode, dup.body)
	close(release)
	r1 := <-first
	assert.Equal(t, http.StatusBadGateway, r1.StatusCode, "the first rolled back")
	if second {
		require.NoError(t, dupStore.Close()) // waits for the duplicate's claim, still going on
	}
	assert.Zero(t, dupSrv.runs.Load(), "the duplicate that gave up never ran the handler")
	isRolledBack(t, f, srv, "k", "p")
	assert.Zero(t, dupSrv.runs.Load())
}

// testQuota: in the transactional mode a scope over its ScopeQuota is
// answered 429 and its claim rolled back, and a key whose response is not
// remembered (a 5xx) gives its place in the quota back.
func testQuota(t *testing.T, h Harness) {
	f := h.New(t, idem.Options{})
	srv := serve(t, h, f.Store, idemhttp.Options{ScopeQuota: 1}, nil, firstThen(func(_ int32, w http.ResponseWriter, r *http.Request) {
		http.Error(w, "bank down", http.StatusBadGateway)
	}, charge(f)))
	assert.Equal(t, http.StatusBadGateway, mustPost(t, srv.URL, "k1", "p").StatusCode)
	first := mustPost(t, srv.URL, "k2", "p") // the 5xx gave its place back
	isFirstAnswer(t, first)
	over := mustPost(t, srv.URL, "k3", "p")
	assert.Equal(t, http.StatusTooManyRequests, over.StatusCode, over.body)
	assert.NotEmpty(t, over.Header.Get("Retry-After"))
	assert.Equal(t, int32(2), srv.runs.Load(), "the handler did not run over the quota")
	assert.Equal(t, "free", keyState(t, f.Store, "k3"), "the key over the quota is given back")
	isReplayOf(t, first, mustPost(t, srv.URL, "k2", "p")) // known keys still replay
	assert.Equal(t, 1, f.Charges())
}

// quiet is a logger that drops what it is given: the suite's handlers
// fail on purpose.
func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
