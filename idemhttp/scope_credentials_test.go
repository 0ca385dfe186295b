package idemhttp_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"testing"

	"github.com/seed094d4201/idem/idemhttp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// accountHeaderScope is the Scope of a service whose clients name their
// account in a header: a request without it carries no credentials.
func accountHeaderScope(r *http.Request) (string, error) {
	if a := r.Header.Get("X-Account"); a != "" {
		return a, nil
	}
	return "", fmt.Errorf("no X-Account header: %w", idemhttp.ErrNoCredentials)
}

// A client that forgot its credentials is told so with 401 and a problem
// detail, not a 500 that reads as the server's fault; the handler does
// not run. A Scope that fails otherwise is still the server's 500.
func TestScopeWithoutCredentialsIs401(t *testing.T) {
	h := &charges{}
	srv := serve(t, h, idemhttp.Options{Scope: accountHeaderScope})
	resp, body := post(t, srv.Client(), srv.URL, "k", "{}")
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode, body)
	assert.Equal(t, "application/problem+json", resp.Header.Get("Content-Type"))
	var p struct {
		Status int    `json:"status"`
		Detail string `json:"detail"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &p), body)
	assert.Equal(t, http.StatusUnauthorized, p.Status)
	assert.Contains(t, p.Detail, "no credentials")
	assert.Zero(t, h.n.Load())

	failing := serve(t, h, idemhttp.Options{Scope: func(*http.Request) (string, error) {
		return "", errors.New("the account service is down")
	}})
	resp, _ = post(t, failing.Client(), failing.URL, "k", "{}")
	assert.Equal(t, http.StatusInternalServerError, resp.StatusCode)
	assert.Zero(t, h.n.Load())
}
