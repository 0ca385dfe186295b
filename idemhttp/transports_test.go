package idemhttp_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemhttp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A client that hangs up after the status line: the handler, writing 600
// KiB in 32 KiB pieces and stopping at the first write error as io.Copy
// does, is never told, so the retry replays the whole body it produced.
func TestHangUpMidResponseReplaysTheWholeBody(t *testing.T) {
	const size, piece = 600 << 10, 32 << 10
	gone := make(chan struct{})
	var produced atomic.Int64
	var sawErr atomic.Bool
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/octet-stream")
		w.WriteHeader(http.StatusCreated)
		chunk := bytes.Repeat([]byte("x"), piece)
		for i := 0; i < size/piece+1 && produced.Load() < size; i++ {
			n := min(piece, size-int(produced.Load()))
			if _, err := w.Write(chunk[:n]); err != nil {
				sawErr.Store(true)
				return
			}
			produced.Add(int64(n))
			if i == 0 {
				<-gone // the client has read the status line and reset the connection
			}
		}
	}), idemhttp.Options{})

	hangUpAfterStatus(t, srv, gone)
	resp, body := retryAfterHangUp(t, srv)
	assert.Equal(t, http.StatusCreated, resp.StatusCode)
	assert.Equal(t, "true", resp.Header.Get(idemhttp.ReplayedHeader))
	assert.False(t, sawErr.Load(), "the handler was told of the client's hang-up and stopped")
	assert.Equal(t, size, int(produced.Load()))
	if resp.Header.Get(idemhttp.BodyOmittedHeader) == "" {
		assert.Len(t, body, size, "a replay is the whole body, or says it is omitted")
	}
}

// hangUpAfterStatus sends a keyed POST over a raw connection, reads the
// status line (a 201), resets the connection so that every later write by
// the server fails, and closes gone.
func hangUpAfterStatus(t *testing.T, srv *httptest.Server, gone chan struct{}) {
	t.Helper()
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	require.NoError(t, err)
	fmt.Fprintf(conn, "POST / HTTP/1.1\r\nHost: x\r\nIdempotency-Key: k\r\nContent-Length: 2\r\n\r\n{}")
	status, err := bufio.NewReader(conn).ReadString('\n')
	require.NoError(t, err)
	require.Contains(t, status, "201")
	require.NoError(t, conn.(*net.TCPConn).SetLinger(0)) // close with a reset
	require.NoError(t, conn.Close())
	close(gone)
}

// retryAfterHangUp retries key k until the first request's handler has
// returned (409 until then).
func retryAfterHangUp(t *testing.T, srv *httptest.Server) (*http.Response, string) {
	t.Helper()
	for {
		resp, body := post(t, srv.Client(), srv.URL, "k", "{}")
		if resp.StatusCode != http.StatusConflict {
			return resp, body
		}
	}
}

// Past MaxStoredBody a hang-up is told to the handler: nothing more of the
// body can be remembered, and the replay says the body is omitted.
func TestHangUpPastTheBoundStopsTheHandler(t *testing.T) {
	gone := make(chan struct{})
	var sawErr atomic.Bool
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		chunk := bytes.Repeat([]byte("y"), 32<<10)
		for i := 0; i < 64; i++ { // 2 MiB, past the 64 KiB bound below
			if _, err := w.Write(chunk); err != nil {
				sawErr.Store(true)
				return
			}
			if i == 0 {
				<-gone
			}
		}
	}), idemhttp.Options{MaxStoredBody: 64 << 10})
	hangUpAfterStatus(t, srv, gone)
	resp, _ := retryAfterHangUp(t, srv)
	assert.Equal(t, http.StatusCreated, resp.StatusCode)
	assert.Equal(t, "too-large", resp.Header.Get(idemhttp.BodyOmittedHeader))
	assert.True(t, sawErr.Load(), "past the bound the handler hears the client is gone")
}

// Trailers the handler declared and set after the body, and those set
// with http.TrailerPrefix, come back on the replay; credentials never do.
func TestTrailersAreReplayed(t *testing.T) {
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Trailer", "X-Checksum")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "the body")
		w.Header().Set("X-Checksum", "abc123")
		w.Header().Set(http.TrailerPrefix+"X-Rows", "7")
		w.Header().Set(http.TrailerPrefix+"Set-Cookie", "session=secret")
		w.Header().Set(http.TrailerPrefix+"Authorization", "Bearer t0ken")
		w.Header().Set(http.TrailerPrefix+"Authentication-Info", "nextnonce=1")
	}), idemhttp.Options{})
	first, _ := post(t, srv.Client(), srv.URL, "k", "{}")
	require.Equal(t, "abc123", first.Trailer.Get("X-Checksum"))
	retry, body := post(t, srv.Client(), srv.URL, "k", "{}")
	assert.Equal(t, "true", retry.Header.Get(idemhttp.ReplayedHeader))
	assert.Equal(t, "the body", body)
	assert.Equal(t, "abc123", retry.Trailer.Get("X-Checksum"))
	assert.Equal(t, "7", retry.Trailer.Get("X-Rows"))
	for _, name := range []string{"Set-Cookie", "Authorization", "Authentication-Info"} {
		assert.Empty(t, retry.Trailer.Get(name), name)
		assert.Empty(t, retry.Header.Get(name), name)
	}
}

// Trailers survive a Backend and its Codec too.
func TestTrailersSurviveTheCodec(t *testing.T) {
	var r idemhttp.Response
	in := idemhttp.Response{Status: 201, Body: []byte("b"), Trailer: http.Header{"X-Checksum": {"abc"}, "X-Raw": {"\xff"}}}
	data, err := in.MarshalJSON()
	require.NoError(t, err)
	require.NoError(t, r.UnmarshalJSON(data))
	assert.Equal(t, in, r)
}

// The path is fingerprinted as sent: /items/a%2Fb and /items/a/b are two
// resources under Go's mux, so a key reused across them is 422.
func TestEscapedPathsAreDifferentRequests(t *testing.T) {
	var a, b atomic.Int32
	mux := http.NewServeMux()
	mux.HandleFunc("POST /items/{id}", func(w http.ResponseWriter, r *http.Request) {
		a.Add(1)
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "item "+r.PathValue("id"))
	})
	mux.HandleFunc("POST /items/a/b", func(w http.ResponseWriter, r *http.Request) {
		b.Add(1)
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "the a/b resource")
	})
	srv := serve(t, mux, idemhttp.Options{})
	first, body := post(t, srv.Client(), srv.URL+"/items/a%2Fb", "k", "{}")
	require.Equal(t, http.StatusCreated, first.StatusCode)
	require.Equal(t, "item a/b", body)
	second, _ := post(t, srv.Client(), srv.URL+"/items/a/b", "k", "{}")
	assert.Equal(t, http.StatusUnprocessableEntity, second.StatusCode)
	assert.Equal(t, int32(1), a.Load())
	assert.Zero(t, b.Load())
}

// Two keys joined by a proxy into one field are a malformed key, as two
// fields are; a key with a comma in it travels quoted.
func TestCommaJoinedKeysAre400(t *testing.T) {
	h := &charges{}
	srv := serve(t, h, idemhttp.Options{})
	for _, v := range []string{"key-a, key-b", "key-a,key-b"} {
		resp, _ := post(t, srv.Client(), srv.URL, v, "{}")
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode, v)
	}
	assert.Zero(t, h.n.Load())
	resp, _ := post(t, srv.Client(), srv.URL, `"key,with,commas"`, "{}")
	assert.Equal(t, http.StatusCreated, resp.StatusCode)
	_, err := idemhttp.ParseKey("a,b")
	assert.ErrorIs(t, err, idem.ErrInvalidKey)
}

// An empty scope is refused with 500 and runs nothing; the error is
// logged once at Error, then at Debug.
func TestEmptyScopeIsRefused(t *testing.T) {
	h := &charges{}
	var logs bytes.Buffer
	srv := serve(t, h, idemhttp.Options{
		Scope:  func(r *http.Request) (string, error) { return r.Header.Get("X-Account"), nil },
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	for range 3 {
		resp, _ := post(t, srv.Client(), srv.URL, "k", "{}")
		assert.Equal(t, http.StatusInternalServerError, resp.StatusCode)
	}
	assert.Zero(t, h.n.Load())
	assert.Equal(t, 1, strings.Count(logs.String(), "level=ERROR"), logs.String())
}

// Scope sees the request's whole body: a signed webhook's sender is
// known from the signature over it.
func TestScopeSeesTheBody(t *testing.T) {
	secrets := map[string]string{"shop-a": "s3cret"}
	sign := func(sender, body string) string {
		m := hmac.New(sha256.New, []byte(secrets[sender]))
		io.WriteString(m, body)
		return hex.EncodeToString(m.Sum(nil))
	}
	var handlerBody string
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		handlerBody = string(b)
	}), idemhttp.Options{Scope: func(r *http.Request) (string, error) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return "", err
		}
		sender := r.Header.Get("X-Sender")
		if !hmac.Equal([]byte(sign(sender, string(body))), []byte(r.Header.Get("X-Signature"))) {
			return "", errors.New("bad signature")
		}
		return sender, nil
	}})
	req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(`{"event":1}`))
	req.Header.Set(idemhttp.Header, "k")
	req.Header.Set("X-Sender", "shop-a")
	req.Header.Set("X-Signature", sign("shop-a", `{"event":1}`))
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, `{"event":1}`, handlerBody, "the handler still gets the whole body")
}

// A Retry-After too long for a time.Duration, or longer than MaxWait, is
// not retried sooner than asked: the caller gets the answer.
func TestTransportNeverRetriesSoonerThanAsked(t *testing.T) {
	for _, after := range []string{"10000000000", "99999999999999999999", "120"} {
		var n atomic.Int32
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n.Add(1)
			w.Header().Set("Retry-After", after)
			w.WriteHeader(http.StatusServiceUnavailable)
		}))
		client := &http.Client{Transport: &idemhttp.Transport{Base: srv.Client().Transport, MinBackoff: time.Millisecond}}
		resp, err := client.Post(srv.URL, "application/json", strings.NewReader("{}"))
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
		assert.Equal(t, int32(1), n.Load(), "Retry-After: %s", after)
		srv.Close()
	}
}

// A Retry-After within MaxWait is waited out, then retried.
func TestTransportWaitsARetryAfterWithinMaxWait(t *testing.T) {
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 1 {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	client := &http.Client{Transport: &idemhttp.Transport{Base: srv.Client().Transport, MinBackoff: time.Millisecond}}
	start := time.Now()
	resp, err := client.Post(srv.URL, "application/json", strings.NewReader("{}"))
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.GreaterOrEqual(t, time.Since(start), time.Second, "never sooner than asked")
}

// 408 is retried with the same key, as the middleware does not remember it.
func TestTransportRetries408(t *testing.T) {
	var n atomic.Int32
	log := &keyLog{next: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 1 {
			w.WriteHeader(http.StatusRequestTimeout)
		}
	})}
	srv := httptest.NewServer(log)
	defer srv.Close()
	client := &http.Client{Transport: &idemhttp.Transport{Base: srv.Client().Transport, MinBackoff: time.Millisecond}}
	resp, err := client.Post(srv.URL, "application/json", strings.NewReader("{}"))
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	keys := log.seen()
	require.Len(t, keys, 2)
	assert.Equal(t, keys[0], keys[1])
}

// A 307 or 308 that http.Client follows carries the key the Transport made
// for the request it redirects.
func TestTransportKeepsTheKeyAcrossRedirects(t *testing.T) {
	for _, code := range []int{http.StatusTemporaryRedirect, http.StatusPermanentRedirect} {
		mux := http.NewServeMux()
		mux.HandleFunc("/old", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/new", code) })
		mux.HandleFunc("/new", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) })
		log := &keyLog{next: mux}
		srv := httptest.NewServer(log)
		client := &http.Client{Transport: &idemhttp.Transport{Base: srv.Client().Transport}}
		resp, err := client.Post(srv.URL+"/old", "application/json", strings.NewReader("{}"))
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusCreated, resp.StatusCode)
		keys := log.seen()
		require.Len(t, keys, 2)
		assert.NotEmpty(t, keys[0])
		assert.Equal(t, keys[0], keys[1], "status %d", code)
		srv.Close()
	}
}

// A key set under a name net/http did not canonicalise is the request's
// key: sent once, under the canonical name, never beside a new one.
func TestTransportFindsANonCanonicalKey(t *testing.T) {
	log := &keyLog{next: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n := len(r.Header.Values(idemhttp.Header)); n != 1 {
			w.WriteHeader(http.StatusBadRequest)
		}
	})}
	srv := httptest.NewServer(log)
	defer srv.Close()
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, srv.URL, strings.NewReader("{}"))
	req.Header["idempotency-key"] = []string{"mine"}
	client := &http.Client{Transport: &idemhttp.Transport{Base: srv.Client().Transport}}
	resp, err := client.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, []string{"mine"}, log.seen())
	r2 := idemhttp.WithKey(req, "other")
	assert.Equal(t, []string{"other"}, r2.Header.Values(idemhttp.Header))
	assert.NotContains(t, r2.Header, "idempotency-key")
}
