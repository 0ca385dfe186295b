package idemhttp_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed094d4201/idem/idemhttp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// stalledBusy answers its first attempt 503 with Retry-After: 0 and a body
// that stalls after its first bytes (until the test ends or the client
// goes), and every later one 201.
func stalledBusy(t *testing.T) (*httptest.Server, *atomic.Int32) {
	var attempts atomic.Int32
	stop := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if attempts.Add(1) > 1 {
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, "done")
			return
		}
		w.Header().Set("Retry-After", "0")
		w.Header().Set("Content-Length", "1000")
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, "busy, ")
		http.NewResponseController(w).Flush()
		select {
		case <-stop:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(stop) }) // before srv.Close, which waits for the handler
	return srv, &attempts
}

// roundTrip posts through a Transport with short backoffs, and fails the
// test if no answer comes within a bound far past any wait it should make.
func roundTrip(t *testing.T, ctx context.Context, url string) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader("{}"))
	require.NoError(t, err)
	type result struct {
		resp *http.Response
		err  error
	}
	done := make(chan result, 1)
	go func() {
		resp, err := (&idemhttp.Transport{MinBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond}).RoundTrip(req)
		done <- result{resp, err}
	}()
	select {
	case r := <-done:
		if r.resp != nil {
			t.Cleanup(func() { r.resp.Body.Close() })
		}
		return r.resp, r.err
	case <-time.After(10 * time.Second):
		t.Fatal("the Transport is still waiting before its retry")
		return nil, nil
	}
}

// A retryable answer whose body stalls is closed, not drained, once a
// short bound passes: the retry goes out at once, for a caller with no
// deadline (who would wait for ever) and for one with a deadline (who
// would get its ctx error though the retry answers at once).
func TestTransportBoundsTheDrainBeforeARetry(t *testing.T) {
	t.Run("NoDeadline", func(t *testing.T) {
		srv, attempts := stalledBusy(t)
		resp, err := roundTrip(t, context.Background(), srv.URL)
		require.NoError(t, err)
		assert.Equal(t, http.StatusCreated, resp.StatusCode)
		assert.Equal(t, int32(2), attempts.Load())
	})
	t.Run("WithDeadline", func(t *testing.T) {
		srv, attempts := stalledBusy(t)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		resp, err := roundTrip(t, ctx, srv.URL)
		require.NoError(t, err, "the retry answers at once")
		assert.Equal(t, http.StatusCreated, resp.StatusCode)
		assert.Equal(t, int32(2), attempts.Load())
	})
}

// The drain never holds the retry back past its backoff: a caller whose
// deadline comes before the drain's own bound (100 ms) but well after the
// backoff gets the retry's answer, not its ctx error.
func TestTransportDrainNeverOutlastsTheBackoff(t *testing.T) {
	srv, attempts := stalledBusy(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Millisecond)
	defer cancel()
	resp, err := roundTrip(t, ctx, srv.URL)
	require.NoError(t, err, "the retry, after a backoff of at most 1 ms, answers at once")
	assert.Equal(t, http.StatusCreated, resp.StatusCode)
	assert.Equal(t, int32(2), attempts.Load())
}

// bodiless answers 503 with no Body at all, against RoundTripper's
// contract, then 201.
type bodiless struct{ attempts atomic.Int32 }

func (b *bodiless) RoundTrip(r *http.Request) (*http.Response, error) {
	if b.attempts.Add(1) == 1 {
		return &http.Response{StatusCode: http.StatusServiceUnavailable, Header: http.Header{}, Request: r}, nil
	}
	return &http.Response{StatusCode: http.StatusCreated, Header: http.Header{}, Body: http.NoBody, Request: r}, nil
}

// An answer to retry without a Body (a Base that breaks the contract) is
// retried, not a panic.
func TestTransportRetriesAnAnswerWithoutABody(t *testing.T) {
	base := &bodiless{}
	req, err := http.NewRequest(http.MethodPost, "http://example.invalid/", nil)
	require.NoError(t, err)
	resp, err := (&idemhttp.Transport{Base: base, MinBackoff: time.Millisecond}).RoundTrip(req)
	require.NoError(t, err)
	assert.Equal(t, http.StatusCreated, resp.StatusCode)
	assert.Equal(t, int32(2), base.attempts.Load())
}

// stuckClose is a body read whole at once whose Close blocks until
// release is closed, as an HTTP/2 body's may while the connection's
// writes are stalled.
type stuckClose struct {
	io.Reader
	release <-chan struct{}
}

func (b stuckClose) Close() error { <-b.release; return nil }

// stuckBusy answers 503 with Retry-After: 0 and a stuckClose body, then
// 201.
type stuckBusy struct {
	attempts atomic.Int32
	release  chan struct{}
}

func (b *stuckBusy) RoundTrip(r *http.Request) (*http.Response, error) {
	if b.attempts.Add(1) == 1 {
		return &http.Response{StatusCode: http.StatusServiceUnavailable, Header: http.Header{"Retry-After": {"0"}},
			Body: stuckClose{strings.NewReader("busy"), b.release}, Request: r}, nil
	}
	return &http.Response{StatusCode: http.StatusCreated, Header: http.Header{}, Body: http.NoBody, Request: r}, nil
}

// A retried answer's body whose Close blocks never holds the retry
// back: the drain's bound covers the close as well as the reads.
func TestTransportRetriesPastABodyWhoseCloseBlocks(t *testing.T) {
	base := &stuckBusy{release: make(chan struct{})}
	defer close(base.release)
	req, err := http.NewRequest(http.MethodPost, "http://example.invalid/", strings.NewReader("{}"))
	require.NoError(t, err)
	done := make(chan *http.Response, 1)
	go func() {
		resp, err := (&idemhttp.Transport{Base: base, MinBackoff: time.Millisecond}).RoundTrip(req)
		assert.NoError(t, err)
		done <- resp
	}()
	select {
	case resp := <-done:
		require.NotNil(t, resp)
		assert.Equal(t, http.StatusCreated, resp.StatusCode)
	case <-time.After(10 * time.Second):
		t.Fatal("the Transport waits for the retried answer's Close")
	}
}
