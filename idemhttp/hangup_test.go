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

// A handler that writes for ever to a client that hung up is stopped
// once MaxStoredBody is past (its write fails), and its outcome is
// remembered without the body.
func TestHandlerWritingForeverToAGoneClientIsStopped(t *testing.T) {
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
	}), idemhttp.Options{Unscoped: true, MaxStoredBody: 64 << 10})
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
		if resp.StatusCode == http.StatusConflict { // the outcome is still being recorded
			yield()
			continue
		}
		assert.Equal(t, http.StatusOK, resp.StatusCode)
		assert.Equal(t, "too-large", resp.Header.Get(idemhttp.BodyOmittedHeader))
		assert.Empty(t, body)
		break
	}
}

// A client that hangs up before the handler has sent anything loses
// nothing: the handler runs to its end, and the retry replays its whole
// answer.
func TestHangUpBeforeTheHeadersKeepsTheOutcome(t *testing.T) {
	var runs atomic.Int32
	started, release, hungUp := make(chan struct{}), make(chan struct{}), make(chan struct{})
	guarded := idemhttp.Middleware(newStore(t, idem.Options{}), idemhttp.Options{Unscoped: true})(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if runs.Add(1) == 1 {
				close(started)
			}
			<-release
			w.Header().Set("X-A", "1")
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, strings.Repeat("z", 100<<10))
		}))
	var first atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if first.CompareAndSwap(false, true) {
			// net/http ends the request's context when its client goes.
			ctx := r.Context()
			go func() { <-ctx.Done(); close(hungUp) }()
		}
		guarded.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	require.NoError(t, err)
	fmt.Fprintf(conn, "POST / HTTP/1.1\r\nHost: x\r\nIdempotency-Key: k\r\nContent-Length: 2\r\n\r\n{}")
	<-started
	conn.(*net.TCPConn).SetLinger(0)
	conn.Close()
	<-hungUp
	close(release)
	for {
		resp, body := post(t, srv.Client(), srv.URL, "k", "{}")
		if resp.StatusCode == http.StatusConflict { // the outcome is still being recorded
			yield()
			continue
		}
		assert.Equal(t, http.StatusCreated, resp.StatusCode)
		assert.Equal(t, "1", resp.Header.Get("X-A"))
		assert.Len(t, body, 100<<10)
		break
	}
	assert.EqualValues(t, 1, runs.Load())
}
