package idemgin_test

import (
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/seed094d4201/idem/idemhttp"
	"github.com/stretchr/testify/assert"
)

// A handler that upgrades the connection the way WebSocket libraries do
// (101 Switching Protocols sent through the Writer, then Hijack)
// answered on it: it is remembered as done, and a retry replays that it
// ran.
func TestUpgradedHandlerIsNotRunAgain(t *testing.T) {
	var runs atomic.Int32
	srv := serveGin(t, func(r *gin.Engine, guard gin.HandlerFunc) {
		r.POST("/upgrade", guard, func(c *gin.Context) {
			runs.Add(1)
			c.Header("Connection", "Upgrade")
			c.Header("Upgrade", "tcp")
			c.Writer.WriteHeader(http.StatusSwitchingProtocols)
			c.Writer.WriteHeaderNow()
			conn, rw, err := c.Writer.Hijack()
			if err != nil {
				return
			}
			io.WriteString(rw, "on the connection")
			rw.Flush()
			conn.Close()
		})
	})
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/upgrade", strings.NewReader("{}"))
	req.Header.Set(idemhttp.Header, "k")
	if resp, err := http.DefaultClient.Do(req); err == nil { // its answer is its own
		resp.Body.Close()
	}
	retry, body := postKey(t, srv.URL+"/upgrade", "k", "{}")
	assert.Equal(t, int32(1), runs.Load(), "the handler ran again")
	assert.Equal(t, http.StatusOK, retry.StatusCode)
	assert.Equal(t, "hijacked", retry.Header.Get("Idempotent-Body-Omitted"))
	assert.Empty(t, body)
}

// A handler that takes the connection over and then panics, under
// gin.Recovery, failed before commit: its key is released and a retry
// runs it again; nothing is written on the connection it took.
func TestHijackedHandlerThatPanicsIsReleased(t *testing.T) {
	var runs atomic.Int32
	srv := serveGin(t, func(r *gin.Engine, guard gin.HandlerFunc) {
		r.Use(gin.CustomRecoveryWithWriter(io.Discard, func(c *gin.Context, err any) { c.AbortWithStatus(http.StatusInternalServerError) }))
		r.POST("/attach", guard, func(c *gin.Context) {
			if runs.Add(1) > 1 {
				c.Status(http.StatusCreated)
				return
			}
			conn, _, err := c.Writer.Hijack()
			if err != nil {
				return
			}
			conn.Close()
			panic("after the hijack")
		})
	})
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/attach", strings.NewReader("{}"))
	req.Header.Set(idemhttp.Header, "k")
	_, err := http.DefaultClient.Do(req)
	assert.Error(t, err, "the connection was closed unanswered")
	// A retry that came while the key was still held waited for the
	// panic and was told so; the next runs the handler again.
	retry, _ := postKey(t, srv.URL+"/attach", "k", "{}")
	if retry.StatusCode == http.StatusInternalServerError {
		retry, _ = postKey(t, srv.URL+"/attach", "k", "{}")
	}
	assert.Equal(t, http.StatusCreated, retry.StatusCode)
	assert.Equal(t, int32(2), runs.Load())
}
