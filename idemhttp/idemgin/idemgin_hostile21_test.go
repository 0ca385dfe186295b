package idemgin_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/stretchr/testify/assert"
)

// An auth/tracing middleware *before* the guard records a non-fatal
// c.Error. The guarded handler then answers 204 with no body. The guard
// counts the earlier error as the handler's and releases the key: every
// retry runs the handler again.
func TestH21GinErrorsFromBeforeGuardReleaseKey(t *testing.T) {
	var runs atomic.Int32
	srv := reviewServer(t, func(r *gin.Engine, guard gin.HandlerFunc) {
		r.Use(func(c *gin.Context) { _ = c.Error(errors.New("token near expiry")); c.Next() })
		r.Use(guard)
		r.POST("/x", func(c *gin.Context) { runs.Add(1); c.Status(http.StatusNoContent) })
	})
	a, _ := reviewPost(t, srv.URL+"/x", "k", "{}")
	b, _ := reviewPost(t, srv.URL+"/x", "k", "{}")
	t.Logf("statuses %d %d, replayed %q", a.StatusCode, b.StatusCode, b.Header.Get("Idempotent-Replayed"))
	assert.EqualValues(t, 1, runs.Load(), "a 204 the handler gave was not remembered: it ran again")
}

// c.Stream to a client that hangs up.
func TestH21GinStreamGoneClient(t *testing.T) {
	var runs atomic.Int32
	stopped := make(chan struct{})
	srv := reviewServer(t, func(r *gin.Engine, guard gin.HandlerFunc) {
		r.Use(guard)
		r.POST("/x", func(c *gin.Context) {
			runs.Add(1)
			defer close(stopped)
			i := 0
			c.Stream(func(w io.Writer) bool {
				i++
				fmt.Fprintf(w, "event %d\n", i)
				time.Sleep(time.Millisecond)
				return i < 5000
			})
		})
	})
	conn, _ := net.Dial("tcp", srv.Listener.Addr().String())
	fmt.Fprintf(conn, "POST /x HTTP/1.1\r\nHost: x\r\nIdempotency-Key: k\r\nContent-Length: 2\r\n\r\n{}")
	bufio.NewReader(conn).ReadString('\n')
	conn.(*net.TCPConn).SetLinger(0)
	conn.Close()
	select {
	case <-stopped:
	case <-time.After(3 * time.Second):
		t.Fatal("stream handler did not stop after client left")
	}
	b, _ := reviewPost(t, srv.URL+"/x", "k", "{}")
	t.Logf("retry: %d omitted=%q runs=%d", b.StatusCode, b.Header.Get("Idempotent-Body-Omitted"), runs.Load())
}
