package idemgin_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemhttp"
	"github.com/seed094d4201/idem/idemhttp/idemgin"
	"github.com/stretchr/testify/assert"
)

// A request without credentials, which Scope says with
// idemhttp.ErrNoCredentials, is answered 401, not 500, and its handler
// does not run.
func TestScopeWithoutCredentialsIs401(t *testing.T) {
	gin.SetMode(gin.TestMode)
	store := idem.New[idemhttp.Response](idem.Options{})
	t.Cleanup(func() { store.Close() })
	r := gin.New()
	ran := 0
	r.Use(idemgin.Middleware(store, idemgin.Options{Scope: func(c *gin.Context) (string, error) {
		if a := c.GetHeader("X-Account"); a != "" {
			return a, nil
		}
		return "", fmt.Errorf("no X-Account header: %w", idemhttp.ErrNoCredentials)
	}}))
	r.POST("/charges", func(c *gin.Context) { ran++; c.Status(http.StatusCreated) })

	req := httptest.NewRequest(http.MethodPost, "/charges", strings.NewReader("{}"))
	req.Header.Set(idemhttp.Header, "k")
	w := httptest.NewRecorder()
	r.ServeHTTP(w, req)
	assert.Equal(t, http.StatusUnauthorized, w.Code, w.Body.String())
	assert.Equal(t, "application/problem+json", w.Header().Get("Content-Type"))
	assert.Zero(t, ran)
}
