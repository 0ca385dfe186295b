package idemhttp_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemhttp"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// heldClaims is a Backend whose second Claim waits for release, so that a
// test can act while that claim is on its way to the backend.
type heldClaims struct {
	backend.Backend
	claims  atomic.Int32
	entered chan struct{}
	release chan struct{}
}

func (b *heldClaims) Claim(ctx context.Context, rec backend.Record, now time.Time, lease time.Duration) (backend.Record, bool, error) {
	if b.claims.Add(1) == 2 {
		close(b.entered)
		<-b.release
	}
	return b.Backend.Claim(ctx, rec, now, lease)
}

// A retry of a remembered request (same key, same payload) replays it,
// even while a request with the same key and another payload is being
// checked against the backend in this process: it was answered 422, the
// store taking the other request's payload, not yet refused, for the
// key's (found by TestMiddlewareModel over bolt, with a waiter of each
// payload behind a run).
func TestRetryIsNotRefusedWhileAnotherPayloadIsChecked(t *testing.T) {
	b := &heldClaims{Backend: idemtest.NewMemoryBackend(), entered: make(chan struct{}), release: make(chan struct{})}
	store := newStore(t, idem.Options{Backend: b})
	var runs atomic.Int32
	srv := serveStore(t, store, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
	first, _ := post(t, srv.Client(), srv.URL, "k", `{"a":1}`)
	require.Equal(t, http.StatusCreated, first.StatusCode)

	other := make(chan int)
	go func() { // its claim is held on its way to the backend
		req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(`{"a":2}`))
		req.Header.Set(idemhttp.Header, "k")
		resp, err := srv.Client().Do(req)
		if err != nil {
			other <- 0
			return
		}
		resp.Body.Close()
		other <- resp.StatusCode
	}()
	<-b.entered
	retried := make(chan *http.Response)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(`{"a":1}`))
		req.Header.Set(idemhttp.Header, "k")
		resp, err := srv.Client().Do(req)
		if err == nil {
			resp.Body.Close()
		}
		retried <- resp
	}()
	var retry *http.Response
	select {
	case retry = <-retried: // answered at once: it must be the replay
	case <-time.After(100 * time.Millisecond): // waiting on the held claim, as it may
		close(b.release)
		retry = <-retried
	}
	select {
	case <-b.release:
	default:
		close(b.release)
	}
	require.NotNil(t, retry)
	assert.Equal(t, http.StatusCreated, retry.StatusCode, "the retry of the remembered request")
	assert.Equal(t, "true", retry.Header.Get(idemhttp.ReplayedHeader))
	assert.Equal(t, http.StatusUnprocessableEntity, <-other)
	assert.Equal(t, int32(1), runs.Load())
}

// serveStore starts a real TCP server with the middleware over store and h.
func serveStore(t *testing.T, store *idem.Store[idemhttp.Response], h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(idemhttp.Middleware(store, idemhttp.Options{Unscoped: true, Logger: quiet()})(h))
	t.Cleanup(srv.Close)
	return srv
}
