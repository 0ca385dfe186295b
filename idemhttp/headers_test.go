package idemhttp_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemhttp"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A handler (or a library under it) that writes header names into the map
// in lower case, which net/http sends as they are: they are judged by
// their canonical names, so set-cookie and www-authenticate are never
// replayed, nor a skipped x-request-id.
func TestHeaderNamesAreJudgedWhateverTheirCase(t *testing.T) {
	var runs atomic.Int32
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.Header()["set-cookie"] = []string{"session=secret-of-first-response"}
		w.Header()["www-authenticate"] = []string{`Bearer realm="x"`}
		w.Header()["x-request-id"] = []string{"req-1"}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "ok")
	}), idemhttp.Options{SkipHeaders: []string{"X-Request-Id"}})
	first, _ := post(t, srv.Client(), srv.URL, "k", "{}")
	require.Equal(t, http.StatusCreated, first.StatusCode)
	retry, _ := post(t, srv.Client(), srv.URL, "k", "{}")
	assert.Equal(t, "true", retry.Header.Get(idemhttp.ReplayedHeader))
	assert.Empty(t, retry.Header.Values("Set-Cookie"), "Set-Cookie must never be replayed")
	assert.Empty(t, retry.Header.Values("Www-Authenticate"), "WWW-Authenticate must never be replayed")
	assert.Empty(t, retry.Header.Values("X-Request-Id"), "SkipHeaders must never be replayed")
}

// A header value with obs-text bytes (legal in HTTP) comes back byte for
// byte through a Backend, whose Codec is encoding/json.
func TestNonUTF8HeaderIsReplayedByteForByte(t *testing.T) {
	store := newStore(t, idem.Options{Backend: idemtest.NewMemoryBackend()})
	val := "attachment; filename=\"r\xe9sum\xe9.pdf\"" // Latin-1
	srv := httptest.NewServer(idemhttp.Middleware(store, idemhttp.Options{})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Disposition", val)
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "x")
	})))
	defer srv.Close()
	first, _ := post(t, srv.Client(), srv.URL, "k", "{}")
	require.Equal(t, val, first.Header.Get("Content-Disposition"))
	retry, _ := post(t, srv.Client(), srv.URL, "k", "{}")
	require.Equal(t, "true", retry.Header.Get(idemhttp.ReplayedHeader))
	assert.Equal(t, []byte(val), []byte(retry.Header.Get("Content-Disposition")), "replayed header bytes differ")
}
