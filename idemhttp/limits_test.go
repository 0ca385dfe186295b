package idemhttp_test

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
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

// Past MaxWaiters, a duplicate of a key in flight is 409 at once: one
// client cannot pin a goroutine and a body per request for the whole Wait.
func TestDuplicatesPastMaxWaitersAreRefusedAtOnce(t *testing.T) {
	gate, entered := make(chan struct{}), make(chan struct{}, 1)
	h := &charges{}
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		<-gate
		h.ServeHTTP(w, r)
	}), idemhttp.Options{Unscoped: true, MaxWaiters: 2, Wait: time.Hour})
	const requests = 10
	codes := make(chan int, requests)
	var wg sync.WaitGroup
	send := func() {
		wg.Go(func() {
			resp, _ := post(t, srv.Client(), srv.URL, "k", "{}")
			codes <- resp.StatusCode
		})
	}
	send()
	<-entered // the owner runs; everything after it is a duplicate
	for range requests - 1 {
		send()
	}
	for range requests - 3 { // all but the owner and two waiters, before the owner ends
		select {
		case c := <-codes:
			require.Equal(t, http.StatusConflict, c)
		case <-time.After(time.Minute):
			t.Fatal("duplicates past MaxWaiters were held")
		}
	}
	close(gate)
	wg.Wait()
	close(codes)
	for c := range codes {
		assert.Equal(t, http.StatusCreated, c, "the owner and the two it held")
	}
	assert.Equal(t, int32(1), h.n.Load())
}

// A scope over ScopeQuota is 429 with Retry-After; a key whose response is
// not remembered (a 5xx) holds no share of it.
func TestScopeQuota(t *testing.T) {
	var fail atomic.Bool
	h := &charges{}
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if fail.Load() {
			http.Error(w, "bank down", http.StatusBadGateway)
			return
		}
		h.ServeHTTP(w, r)
	}), idemhttp.Options{Unscoped: true, ScopeQuota: 2, ScopeQuotaWindow: time.Hour})
	fail.Store(true)
	for i := range 5 {
		resp, _ := post(t, srv.Client(), srv.URL, "failed-"+strconv.Itoa(i), "{}")
		require.Equal(t, http.StatusBadGateway, resp.StatusCode, "released keys are given back")
	}
	fail.Store(false)
	for _, k := range []string{"a", "b"} {
		resp, _ := post(t, srv.Client(), srv.URL, k, "{}")
		require.Equal(t, http.StatusCreated, resp.StatusCode)
	}
	resp, body := post(t, srv.Client(), srv.URL, "c", "{}")
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode, body)
	after, err := strconv.Atoi(resp.Header.Get("Retry-After"))
	require.NoError(t, err)
	assert.Positive(t, after)
	assert.LessOrEqual(t, after, int((time.Hour + time.Hour/16 + time.Second).Seconds()))
	resp, _ = post(t, srv.Client(), srv.URL, "a", "{}")
	assert.Equal(t, "true", resp.Header.Get(idemhttp.ReplayedHeader), "a known key replays over the quota")
	assert.Equal(t, int32(2), h.n.Load())
}

// A nil Scope that is not declared Unscoped is warned about once, when the
// middleware is made; a declared one is not.
func TestNilScopeWarnsUnlessUnscoped(t *testing.T) {
	store := newStore(t, idem.Options{})
	for _, tc := range []struct {
		opts idemhttp.Options
		want slog.Level
	}{
		{idemhttp.Options{}, slog.LevelWarn},
		{idemhttp.Options{Unscoped: true}, slog.LevelDebug},
		{idemhttp.Options{Scope: func(*http.Request) (string, error) { return "a", nil }}, slog.LevelDebug},
	} {
		log := &levels{}
		tc.opts.Logger = slog.New(log)
		idemhttp.Middleware(store, tc.opts)
		assert.Equal(t, tc.want, log.max(), "Unscoped %v, Scope %v", tc.opts.Unscoped, tc.opts.Scope != nil)
	}
}

// An unscoped route's record is found under StoreKey("", key), where no
// scoped route's can be.
func TestUnscopedStoreKey(t *testing.T) {
	store := newStore(t, idem.Options{Backend: idemtest.NewMemoryBackend()})
	srv := httptest.NewServer(idemhttp.Middleware(store, idemhttp.Options{Unscoped: true})(&charges{}))
	t.Cleanup(srv.Close)
	post(t, srv.Client(), srv.URL, "k1", "{}")
	var found []string
	for rec, err := range store.Records(context.Background()) {
		require.NoError(t, err)
		found = append(found, rec.Key)
	}
	assert.Equal(t, []string{idemhttp.StoreKey("", "k1")}, found)
	assert.Equal(t, "0::k1", idemhttp.StoreKey("", "k1"))
}

// A duplicate waiting on a key in flight spends none of its scope's quota
// (a client's ordinary retry of a slow request once made its next key a
// 429).
func TestWaitingDuplicateSpendsNoQuota(t *testing.T) {
	gate, entered := make(chan struct{}), make(chan struct{}, 1)
	h := &charges{}
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(idemhttp.Header) == "slow" {
			entered <- struct{}{}
			<-gate
		}
		h.ServeHTTP(w, r)
	}), idemhttp.Options{Unscoped: true, ScopeQuota: 2, ScopeQuotaWindow: time.Hour, MaxWaiters: 1, Wait: time.Hour})
	codes := make(chan int, 3)
	var wg sync.WaitGroup
	send := func() {
		wg.Go(func() {
			resp, _ := post(t, srv.Client(), srv.URL, "slow", "{}")
			codes <- resp.StatusCode
		})
	}
	send()
	<-entered
	send()
	send()
	// With MaxWaiters 1, one of the two duplicates is refused at once, so
	// once one is, the other is held, waiting on the slow key.
	require.Equal(t, http.StatusConflict, <-codes)
	resp, body := post(t, srv.Client(), srv.URL, "second", "{}")
	assert.Equal(t, http.StatusCreated, resp.StatusCode, "the scope has made 2 keys with a quota of 2: %s", body)
	close(gate)
	wg.Wait()
}

// A handler that ends its goroutine releases its key and gives back its
// share of the quota.
func TestGoexitGivesBackTheQuota(t *testing.T) {
	var exit atomic.Bool
	exit.Store(true)
	h := &charges{}
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if exit.Load() {
			runtime.Goexit()
		}
		h.ServeHTTP(w, r)
	}), idemhttp.Options{Unscoped: true, ScopeQuota: 1, ScopeQuotaWindow: time.Hour})
	req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("{}"))
	req.Header.Set(idemhttp.Header, "exits")
	if resp, err := srv.Client().Do(req); err == nil {
		resp.Body.Close()
	}
	exit.Store(false)
	resp, body := post(t, srv.Client(), srv.URL, "next", "{}")
	assert.Equal(t, http.StatusCreated, resp.StatusCode, body)
}

// Retry-After stays right for the longest quota window.
func TestRetryAfterForTheLongestWindow(t *testing.T) {
	srv := serve(t, &charges{}, idemhttp.Options{Unscoped: true, ScopeQuota: 1, ScopeQuotaWindow: math.MaxInt64})
	post(t, srv.Client(), srv.URL, "a", "{}")
	resp, _ := post(t, srv.Client(), srv.URL, "b", "{}")
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	after, err := strconv.Atoi(resp.Header.Get("Retry-After"))
	require.NoError(t, err)
	assert.Greater(t, after, 100*365*24*3600, "Retry-After %d s for a window of ~292 years", after)
}

// A duplicate whose client hung up stops waiting and frees its MaxWaiters
// slot (it once held its goroutine, body and slot for the whole Wait, and
// the live client's own retry was 409).
func TestHungUpDuplicateFreesItsSlot(t *testing.T) {
	gate, entered := make(chan struct{}), make(chan struct{}, 1)
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		<-gate
		w.WriteHeader(http.StatusCreated)
	}), idemhttp.Options{Unscoped: true, MaxWaiters: 1, Wait: time.Hour})
	defer close(gate)
	go post(t, srv.Client(), srv.URL, "k", "{}") // the owner, held at the gate
	<-entered
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	require.NoError(t, err)
	fmt.Fprint(conn, "POST / HTTP/1.1\r\nHost: x\r\nIdempotency-Key: k\r\nContent-Length: 2\r\n\r\n{}")
	// Once a live duplicate is refused, the hung-up one holds the slot.
	for {
		resp, _ := post(t, srv.Client(), srv.URL, "k", "{}")
		if resp.StatusCode == http.StatusConflict {
			break
		}
	}
	conn.Close()
	// Now a live duplicate waits (its own short deadline ends it) instead
	// of being refused at once.
	deadline := time.Now().Add(time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, strings.NewReader("{}"))
		req.Header.Set(idemhttp.Header, "k")
		resp, err := srv.Client().Do(req)
		cancel()
		if err != nil {
			return // it waited: the slot was free
		}
		resp.Body.Close()
		require.True(t, time.Now().Before(deadline), "the hung-up duplicate still holds the slot")
	}
}
