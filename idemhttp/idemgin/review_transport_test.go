package idemgin_test

import (
	"errors"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// gin's docs recommend c.Error for every error met while serving, for a
// logging middleware to collect. A create that succeeded, logged a
// non-fatal error (a webhook that failed, a slow cache) and answered 201
// with a Location and no body has its key released: the retry charges
// again.
func TestReviewGinLoggedErrorOnBodylessSuccessRunsTwice(t *testing.T) {
	var runs atomic.Int32
	srv := reviewServer(t, func(r *gin.Engine, guard gin.HandlerFunc) {
		r.POST("/charges", guard, func(c *gin.Context) {
			n := runs.Add(1)
			_ = c.Error(errors.New("notifying the ledger failed; queued for later")) // logged, not fatal
			c.Header("Location", "/charges/"+string(rune('0'+n)))
			c.Status(http.StatusCreated)
		})
	})
	first, _ := reviewPost(t, srv.URL+"/charges", "k", "{}")
	require.Equal(t, http.StatusCreated, first.StatusCode)
	retry, _ := reviewPost(t, srv.URL+"/charges", "k", "{}")
	assert.Equal(t, http.StatusCreated, retry.StatusCode)
	assert.Equal(t, "true", retry.Header.Get("Idempotent-Replayed"))
	assert.Equal(t, int32(1), runs.Load(), "a 201 the client was sent is released and run again")
}
