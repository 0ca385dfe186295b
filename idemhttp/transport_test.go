package idemhttp_test

import (
	"context"
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
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// keyLog records the Idempotency-Key of every request that reaches it.
type keyLog struct {
	mu   sync.Mutex
	keys []string
	next http.Handler
}

func (l *keyLog) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	l.mu.Lock()
	l.keys = append(l.keys, r.Header.Get(idemhttp.Header))
	l.mu.Unlock()
	l.next.ServeHTTP(w, r)
}

func (l *keyLog) seen() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.keys...)
}

// dropProxy forwards requests to upstream, but for the first drops replies
// it cuts the client's connection instead of answering: the upstream did
// the work, and its reply is lost on the way back.
type dropProxy struct {
	upstream string
	drops    int32
	seen     atomic.Int32
}

func (p *dropProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	out, err := http.NewRequestWithContext(r.Context(), r.Method, p.upstream+r.URL.RequestURI(), r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	out.Header = r.Header.Clone()
	resp, err := http.DefaultTransport.RoundTrip(out)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	if p.seen.Add(1) <= p.drops {
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Close()
		}
		return
	}
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(w, resp.Body)
}

// fastClient retries with millisecond backoffs.
func fastClient() *http.Client {
	return &http.Client{Transport: &idemhttp.Transport{MinBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond}}
}

func TestTransportLostReplyChargesOnce(t *testing.T) {
	h := &charges{}
	log := &keyLog{next: idemhttp.Middleware(newStore(t, idem.Options{}), idemhttp.Options{Required: true})(h)}
	upstream := httptest.NewServer(log)
	defer upstream.Close()
	proxy := httptest.NewServer(&dropProxy{upstream: upstream.URL, drops: 1})
	defer proxy.Close()

	resp, body := post(t, fastClient(), proxy.URL+"/charges", "", `{"order":101}`)
	assert.Equal(t, http.StatusCreated, resp.StatusCode)
	assert.Equal(t, "true", resp.Header.Get(idemhttp.ReplayedHeader), "the retry got the first execution's answer")
	assert.Contains(t, body, `"charge":1`)
	assert.Equal(t, int32(1), h.n.Load(), "one logical POST, one charge")
	keys := log.seen()
	require.GreaterOrEqual(t, len(keys), 2)
	for _, k := range keys {
		assert.Equal(t, keys[0], k, "every attempt carries the same key")
	}
	assert.NotEmpty(t, keys[0])
}

// scripted answers each attempt with the next status in its script (the
// last one repeats), with Retry-After when retryAfter is set.
type scripted struct {
	mu         sync.Mutex
	statuses   []int
	retryAfter string
	attempts   int
	keys       []string
	bodies     []string
}

func (s *scripted) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	status := s.statuses[min(s.attempts, len(s.statuses)-1)]
	s.attempts++
	s.keys = append(s.keys, r.Header.Get(idemhttp.Header))
	s.bodies = append(s.bodies, string(body))
	s.mu.Unlock()
	if s.retryAfter != "" && status >= 400 {
		w.Header().Set("Retry-After", s.retryAfter)
	}
	w.WriteHeader(status)
}

func TestTransportRetriesOnlyUnknownOutcomes(t *testing.T) {
	for _, tc := range []struct {
		statuses []int
		attempts int
	}{
		{[]int{400}, 1},
		{[]int{422}, 1},
		{[]int{500}, 1},
		{[]int{201}, 1},
		{[]int{409, 201}, 2},
		{[]int{425, 201}, 2},
		{[]int{429, 201}, 2},
		{[]int{502, 503, 504, 201}, 4},
		{[]int{503}, 5}, // MaxAttempts (5 by default), then the last answer
	} {
		s := &scripted{statuses: tc.statuses}
		srv := httptest.NewServer(s)
		resp, _ := post(t, fastClient(), srv.URL, "", "payload")
		srv.Close()
		assert.Equal(t, tc.attempts, s.attempts, "%v", tc.statuses)
		assert.Equal(t, tc.statuses[min(tc.attempts, len(tc.statuses))-1], resp.StatusCode)
		for i := range s.bodies {
			assert.Equal(t, "payload", s.bodies[i], "attempt %d: the body is rewound", i+1)
			assert.Equal(t, s.keys[0], s.keys[i])
		}
	}
}

func TestTransportHonoursRetryAfter(t *testing.T) {
	s := &scripted{statuses: []int{503, 201}, retryAfter: "1"}
	srv := httptest.NewServer(s)
	defer srv.Close()
	start := time.Now()
	resp, _ := post(t, fastClient(), srv.URL, "", "x")
	assert.Equal(t, http.StatusCreated, resp.StatusCode)
	assert.GreaterOrEqual(t, time.Since(start), time.Second, "Retry-After: 1 asks for a second")
	assert.Equal(t, 2, s.attempts)
}

func TestTransportGivesUpBeforeTheDeadline(t *testing.T) {
	s := &scripted{statuses: []int{503}, retryAfter: "60"}
	srv := httptest.NewServer(s)
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, strings.NewReader("x"))
	start := time.Now()
	resp, err := fastClient().Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "the last answer, since waiting 60s would outlast the context")
	assert.Equal(t, 1, s.attempts)
	assert.Less(t, time.Since(start), 5*time.Second)
}

func TestTransportRetriesPostWithoutBody(t *testing.T) {
	s := &scripted{statuses: []int{503, 201}}
	srv := httptest.NewServer(s)
	defer srv.Close()
	req, _ := http.NewRequest(http.MethodPost, srv.URL, nil)
	resp, err := fastClient().Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusCreated, resp.StatusCode)
	assert.Equal(t, 2, s.attempts)
}

func TestTransportSendsUnrewindableBodyOnce(t *testing.T) {
	s := &scripted{statuses: []int{503, 201}}
	srv := httptest.NewServer(s)
	defer srv.Close()
	req, _ := http.NewRequest(http.MethodPost, srv.URL, io.MultiReader(strings.NewReader("once"))) // no GetBody
	require.Nil(t, req.GetBody)
	resp, err := fastClient().Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	assert.Equal(t, 1, s.attempts)
}

func TestTransportKeepsCallersKey(t *testing.T) {
	s := &scripted{statuses: []int{502, 201}}
	srv := httptest.NewServer(s)
	defer srv.Close()
	key := idemhttp.NewKey() // made with the order, stored with it
	req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("x"))
	resp, err := fastClient().Do(idemhttp.WithKey(req, key))
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, []string{key, key}, s.keys)
	assert.Empty(t, req.Header.Get(idemhttp.Header), "WithKey does not change the caller's request")
	assert.Len(t, key, 36)
}

func TestTransportLeavesOtherMethodsAlone(t *testing.T) {
	s := &scripted{statuses: []int{503, 200}}
	srv := httptest.NewServer(s)
	defer srv.Close()
	resp, err := fastClient().Get(srv.URL)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, 1, s.attempts)
	assert.Equal(t, []string{""}, s.keys)
}
