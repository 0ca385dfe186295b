package main

import (
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/bolt"
	"github.com/seed094d4201/idem/idemhttp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// httpStore serves one POST through idemhttp over a bolt file and returns
// the file's path, closed.
func httpStore(t *testing.T, opts idemhttp.Options, req func(*http.Request)) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "http.db")
	b, err := bolt.Open(path, nil)
	require.NoError(t, err)
	s := idem.New[idemhttp.Response](idem.Options{Backend: b})
	h := idemhttp.Middleware(s, opts)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/orders/7")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"order":7,"note":"ok"}`))
	}))
	r := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{"sku":"a"}`))
	r.Header.Set("Idempotency-Key", "curl-key-1")
	if req != nil {
		req(r)
	}
	rw := httptest.NewRecorder()
	h.ServeHTTP(rw, r)
	require.Equal(t, http.StatusCreated, rw.Code)
	require.NoError(t, s.Close())
	require.NoError(t, b.Close())
	return path
}

// show decodes what idemhttp stored: the status, the headers, and the body
// as text (JSON indented), not the record's JSON with the body in base64.
func TestShowDecodesAnHTTPResponse(t *testing.T) {
	path := httpStore(t, idemhttp.Options{Unscoped: true}, nil)
	code, out, errs := runCmd("show", path, "curl-key-1", "-scope", "")
	require.Equal(t, 0, code, errs)
	assert.Contains(t, out, "value:       idemhttp response 201\n")
	assert.Contains(t, out, `  header Location: "/orders/7"`)
	assert.Contains(t, out, "  body:      23 bytes\n    {\n      \"order\": 7,\n      \"note\": \"ok\"\n    }\n")
	assert.NotContains(t, out, "eyJ", "no base64 body")
}

// show without -scope on an idemhttp store says how to find the key: with
// -scope ” when a route without Scope stored it, and with the client's
// scope otherwise.
func TestShowHintsAtScope(t *testing.T) {
	path := httpStore(t, idemhttp.Options{Unscoped: true}, nil)
	code, _, errs := runCmd("show", path, "curl-key-1")
	assert.Equal(t, 3, code)
	assert.Contains(t, errs, "-scope ''")
	assert.Contains(t, errs, "idem show "+path+" -scope '' curl-key-1")

	scoped := httpStore(t, idemhttp.Options{Scope: func(r *http.Request) (string, error) { return r.Header.Get("X-Account"), nil }},
		func(r *http.Request) { r.Header.Set("X-Account", "acct-alice") })
	code, _, errs = runCmd("show", scoped, "curl-key-1")
	assert.Equal(t, 3, code)
	assert.Contains(t, errs, "found with -scope and the client's scope")
	code, out, errs := runCmd("show", scoped, "curl-key-1", "-scope", "acct-alice")
	require.Equal(t, 0, code, errs)
	assert.Contains(t, out, "idemhttp response 201")
}
