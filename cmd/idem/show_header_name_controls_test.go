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

// show prints a stored response's header and trailer names with their
// control characters escaped, as it prints a body: the recorder keeps the
// names a handler set as they are (one that copies names it was given,
// from a client or an upstream, included), and a name holding escape
// sequences reached the operator's terminal raw.
func TestShowEscapesControlCharactersInHeaderNames(t *testing.T) {
	path := filepath.Join(t.TempDir(), "http.db")
	b, err := bolt.Open(path, nil)
	require.NoError(t, err)
	s := idem.New[idemhttp.Response](idem.Options{Backend: b})
	h := idemhttp.Middleware(s, idemhttp.Options{Unscoped: true})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header()["X-Note\x1b[2J\rstate: completed"] = []string{"v"}
		w.Header()[http.TrailerPrefix+"X-Sum\x1b]0;owned\a"] = []string{"t"}
		w.WriteHeader(http.StatusCreated)
	}))
	r := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{}`))
	r.Header.Set("Idempotency-Key", "k1")
	h.ServeHTTP(httptest.NewRecorder(), r)
	require.NoError(t, s.Close())
	require.NoError(t, b.Close())

	code, out, errs := runCmd("show", path, "k1", "-scope", "")
	require.Equal(t, 0, code, errs)
	for _, c := range []string{"\x1b", "\x07", "\r"} {
		assert.NotContains(t, out, c, "a control character reaches the terminal")
	}
	assert.Contains(t, out, `X-Note\x1b[2J\rstate: completed`)
	assert.Contains(t, out, `X-Sum\x1b]0;owned\a`)
}
