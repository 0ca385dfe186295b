package idemhttp_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
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

// WithKey/Transport send a key that holds a comma bare; the server's own
// ParseKey refuses it as "a list of keys". The library talks past itself.
func TestH21WithKeyCommaKeyRefusedByOwnServer(t *testing.T) {
	var runs atomic.Int32
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
	}), idemhttp.Options{})
	key := "order-1,line-2" // idem.CheckKey accepts it
	require.NoError(t, idem.CheckKey(key))
	req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("{}"))
	client := &http.Client{Transport: &idemhttp.Transport{}}
	resp, err := client.Do(idemhttp.WithKey(req, key))
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusCreated, resp.StatusCode, "the library's own client and server disagree on a valid key")
}

// "Trailer: Content-Type" is not a valid trailer: net/http ignores the
// declaration and sends Content-Type as a header. The recorder drops it from
// the headers and keeps it as a trailer, so the replay's Content-Type is lost.
func TestH21InvalidDeclaredTrailerLosesHeaderOnReplay(t *testing.T) {
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Trailer", "Content-Type, Cache-Control")
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"a":1}`)
	}), idemhttp.Options{})
	first, _ := post(t, srv.Client(), srv.URL, "k", "{}")
	second, _ := post(t, srv.Client(), srv.URL, "k", "{}")
	require.Equal(t, "true", second.Header.Get(idemhttp.ReplayedHeader))
	assert.Equal(t, first.Header.Get("Content-Type"), second.Header.Get("Content-Type"))
	assert.Equal(t, first.Header.Get("Cache-Control"), second.Header.Get("Cache-Control"))
}

// Handler writes forever to a gone client: it must be stopped at MaxStoredBody.
func TestH21WriteForeverToGoneClient(t *testing.T) {
	var total atomic.Int64
	done := make(chan error, 1)
	gone := make(chan struct{})
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		chunk := bytes.Repeat([]byte("y"), 8192)
		for i := 0; ; i++ {
			if i == 1 {
				<-gone
			}
			if _, err := w.Write(chunk); err != nil {
				done <- err
				return
			}
			if total.Add(8192) > 1<<30 {
				done <- nil
				return
			}
		}
	}), idemhttp.Options{MaxStoredBody: 64 << 10})
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	require.NoError(t, err)
	fmt.Fprintf(conn, "POST / HTTP/1.1\r\nHost: x\r\nIdempotency-Key: k\r\nContent-Length: 2\r\n\r\n{}")
	_, err = bufio.NewReader(conn).ReadString('\n')
	require.NoError(t, err)
	conn.(*net.TCPConn).SetLinger(0)
	conn.Close()
	close(gone)
	select {
	case err := <-done:
		require.Error(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("handler never stopped")
	}
	for {
		resp, body := post(t, srv.Client(), srv.URL, "k", "{}")
		if resp.StatusCode == http.StatusConflict {
			continue
		}
		assert.Equal(t, http.StatusOK, resp.StatusCode)
		assert.Equal(t, "too-large", resp.Header.Get(idemhttp.BodyOmittedHeader))
		assert.Empty(t, body)
		break
	}
}

// Hang up before the headers are even sent (handler sleeps first).
func TestH21HangUpBeforeHeaders(t *testing.T) {
	var runs atomic.Int32
	release := make(chan struct{})
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		<-release
		w.Header().Set("X-A", "1")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, strings.Repeat("z", 100<<10))
	}), idemhttp.Options{})
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	require.NoError(t, err)
	fmt.Fprintf(conn, "POST / HTTP/1.1\r\nHost: x\r\nIdempotency-Key: k\r\nContent-Length: 2\r\n\r\n{}")
	for runs.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	conn.(*net.TCPConn).SetLinger(0)
	conn.Close()
	time.Sleep(20 * time.Millisecond)
	close(release)
	for {
		resp, body := post(t, srv.Client(), srv.URL, "k", "{}")
		if resp.StatusCode == http.StatusConflict {
			time.Sleep(time.Millisecond)
			continue
		}
		assert.Equal(t, http.StatusCreated, resp.StatusCode)
		assert.Len(t, body, 100<<10)
		break
	}
	assert.EqualValues(t, 1, runs.Load())
}

// Retry-After variants.
func TestH21RetryAfterVariants(t *testing.T) {
	for _, ra := range []string{"-5", "garbage", "99999999999999999999999", time.Now().Add(100 * 365 * 24 * time.Hour).UTC().Format(http.TimeFormat), "Mon, 01 Jan 1990 00:00:00 GMT", "1.5", " 1"} {
		var n atomic.Int32
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if n.Add(1) == 1 {
				w.Header().Set("Retry-After", ra)
				w.WriteHeader(http.StatusServiceUnavailable)
				return
			}
			w.WriteHeader(http.StatusOK)
		}))
		client := &http.Client{Transport: &idemhttp.Transport{MinBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond, MaxWait: 2 * time.Second}}
		start := time.Now()
		resp, err := client.Post(srv.URL, "application/json", strings.NewReader("{}"))
		require.NoError(t, err)
		resp.Body.Close()
		t.Logf("Retry-After %q: status %d attempts %d took %v", ra, resp.StatusCode, n.Load(), time.Since(start))
		srv.Close()
	}
}
