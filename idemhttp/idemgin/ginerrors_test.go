package idemgin_test

import (
	"errors"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/seed094d4201/idem/idemhttp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// gin's idiom for errors: the handler calls c.Error and returns, and an
// error middleware earlier in the chain writes the response after c.Next.
// With the guard, the client gets that middleware's answer, as without
// it; the handler failed, so its key is released (the package doc says
// so) and a retry runs it again, and gets the same answer.
func TestErrorRenderedOutsideTheGuardReleasesTheKey(t *testing.T) {
	var runs atomic.Int32
	errDeclined := errors.New("card declined")
	srv := serveGin(t, func(r *gin.Engine, guard gin.HandlerFunc) {
		r.Use(func(c *gin.Context) { // the app's error middleware
			c.Next()
			if len(c.Errors) > 0 && !c.Writer.Written() {
				c.JSON(http.StatusPaymentRequired, gin.H{"error": c.Errors.Last().Error()})
			}
		})
		r.POST("/bare", func(c *gin.Context) { _ = c.Error(errDeclined) })
		r.POST("/charges", guard, func(c *gin.Context) { runs.Add(1); _ = c.Error(errDeclined) })
	})
	bare, bareBody := postKey(t, srv.URL+"/bare", "", "{}")
	require.Equal(t, http.StatusPaymentRequired, bare.StatusCode, bareBody)

	first, body := postKey(t, srv.URL+"/charges", "k", "{}")
	assert.Equal(t, http.StatusPaymentRequired, first.StatusCode, "the guard changes the app's answer: %q", body)
	retry, rbody := postKey(t, srv.URL+"/charges", "k", "{}")
	assert.Empty(t, retry.Header.Get(idemhttp.ReplayedHeader))
	assert.Equal(t, int32(2), runs.Load())
	assert.Equal(t, first.StatusCode, retry.StatusCode, "the retry is answered as the first was")
	assert.Equal(t, body, rbody)
}

// An error an auth or tracing middleware before the guard records with
// c.Error is not the guarded handler's: the 204 the handler gave is
// remembered, and a retry replays it.
func TestErrorFromBeforeTheGuardIsNotTheHandlers(t *testing.T) {
	var runs atomic.Int32
	srv := serveGin(t, func(r *gin.Engine, guard gin.HandlerFunc) {
		r.Use(func(c *gin.Context) { _ = c.Error(errors.New("token near expiry")); c.Next() })
		r.Use(guard)
		r.POST("/x", func(c *gin.Context) { runs.Add(1); c.Status(http.StatusNoContent) })
	})
	a, _ := postKey(t, srv.URL+"/x", "k", "{}")
	b, _ := postKey(t, srv.URL+"/x", "k", "{}")
	assert.Equal(t, http.StatusNoContent, a.StatusCode)
	assert.Equal(t, http.StatusNoContent, b.StatusCode)
	assert.Equal(t, "true", b.Header.Get(idemhttp.ReplayedHeader))
	assert.EqualValues(t, 1, runs.Load(), "a 204 the handler gave was not remembered: it ran again")
}

// gin's docs recommend c.Error for every error met while serving, for a
// logging middleware to collect. A create that succeeded, logged a
// non-fatal error (a webhook that failed, a slow cache) and answered 201
// with a Location and no body is remembered: a retry replays it.
func TestLoggedErrorOnABodylessSuccessIsRemembered(t *testing.T) {
	var runs atomic.Int32
	srv := serveGin(t, func(r *gin.Engine, guard gin.HandlerFunc) {
		r.POST("/charges", guard, func(c *gin.Context) {
			n := runs.Add(1)
			_ = c.Error(errors.New("notifying the ledger failed; queued for later")) // logged, not fatal
			c.Header("Location", "/charges/"+string(rune('0'+n)))
			c.Status(http.StatusCreated)
		})
	})
	first, _ := postKey(t, srv.URL+"/charges", "k", "{}")
	require.Equal(t, http.StatusCreated, first.StatusCode)
	retry, _ := postKey(t, srv.URL+"/charges", "k", "{}")
	assert.Equal(t, http.StatusCreated, retry.StatusCode)
	assert.Equal(t, "true", retry.Header.Get("Idempotent-Replayed"))
	assert.Equal(t, int32(1), runs.Load(), "a 201 the client was sent is released and run again")
}
