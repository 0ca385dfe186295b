package idemecho_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/labstack/echo/v4"
	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemhttp"
	"github.com/seed094d4201/idem/idemhttp/idemecho"
	"github.com/stretchr/testify/assert"
)

// A request without credentials, which Scope says with
// idemhttp.ErrNoCredentials, is answered 401, not 500, and its handler
// does not run.
func TestScopeWithoutCredentialsIs401(t *testing.T) {
	store := idem.New[idemhttp.Response](idem.Options{})
	t.Cleanup(func() { store.Close() })
	e := echo.New()
	ran := 0
	e.Use(idemecho.Middleware(store, idemecho.Options{Scope: func(c echo.Context) (string, error) {
		if a := c.Request().Header.Get("X-Account"); a != "" {
			return a, nil
		}
		return "", fmt.Errorf("no X-Account header: %w", idemhttp.ErrNoCredentials)
	}}))
	e.POST("/charges", func(c echo.Context) error { ran++; return c.NoContent(http.StatusCreated) })

	req := httptest.NewRequest(http.MethodPost, "/charges", strings.NewReader("{}"))
	req.Header.Set(idemhttp.Header, "k")
	w := httptest.NewRecorder()
	e.ServeHTTP(w, req)
	assert.Equal(t, http.StatusUnauthorized, w.Code, w.Body.String())
	assert.Equal(t, "application/problem+json", w.Header().Get("Content-Type"))
	assert.Zero(t, ran)
}
