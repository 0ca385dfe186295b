package idemgin_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/seed094d4201/idem/idemhttp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// c.Stream (SSE) inside the guard: one run, a replay without body.
func TestStreamRunsOnceAndIsReplayedWithoutItsBody(t *testing.T) {
	var runs atomic.Int32
	srv := serveGin(t, func(r *gin.Engine, guard gin.HandlerFunc) {
		r.POST("/events", guard, func(c *gin.Context) {
			runs.Add(1)
			i := 0
			c.Stream(func(w io.Writer) bool {
				c.SSEvent("tick", i)
				i++
				return i < 3
			})
		})
	})
	first, body := postKey(t, srv.URL+"/events", "k", "{}")
	assert.Equal(t, http.StatusOK, first.StatusCode)
	assert.Contains(t, body, "tick")
	retry, _ := postKey(t, srv.URL+"/events", "k", "{}")
	assert.Equal(t, int32(1), runs.Load())
	assert.Equal(t, http.StatusOK, retry.StatusCode)
	assert.Equal(t, "streamed", retry.Header.Get(idemhttp.BodyOmittedHeader))
}

// c.Stream to a client that hangs up mid-stream: the handler stops (its
// writes fail once nothing more can be remembered), and what it sent is
// remembered as streamed, so a retry does not run it again.
func TestStreamToAClientThatHangsUpStopsAndIsRemembered(t *testing.T) {
	var runs atomic.Int32
	stopped := make(chan struct{})
	srv := serveGin(t, func(r *gin.Engine, guard gin.HandlerFunc) {
		r.Use(guard)
		r.POST("/x", func(c *gin.Context) {
			runs.Add(1)
			defer close(stopped)
			i := 0
			c.Stream(func(w io.Writer) bool {
				i++
				fmt.Fprintf(w, "event %d\n", i)
				time.Sleep(time.Millisecond) // paces the stream, for the client to leave midway
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
	retry, body := postKey(t, srv.URL+"/x", "k", "{}")
	require.Equal(t, http.StatusOK, retry.StatusCode)
	assert.Equal(t, "streamed", retry.Header.Get(idemhttp.BodyOmittedHeader))
	assert.Empty(t, body)
	assert.Equal(t, int32(1), runs.Load())
}
