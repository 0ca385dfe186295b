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
