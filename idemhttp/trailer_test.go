package idemhttp_test

import (
	"io"
	"net/http"
	"testing"

	"github.com/seed094d4201/idem/idemhttp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A declared trailer whose name was also set as a header before
// WriteHeader is sent by net/http as both: the replay sends both.
func TestTrailerAlsoSetAsHeaderIsReplayedAsBoth(t *testing.T) {
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Trailer", "X-Sum")
		w.Header().Set("X-Sum", "pending")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "x")
		w.Header().Set("X-Sum", "abc")
	}), idemhttp.Options{Unscoped: true})
	first, _ := post(t, srv.Client(), srv.URL, "k", "{}")
	replay, _ := post(t, srv.Client(), srv.URL, "k", "{}")
	require.Equal(t, "true", replay.Header.Get(idemhttp.ReplayedHeader))
	assert.Equal(t, "pending", first.Header.Get("X-Sum"))
	assert.Equal(t, first.Header.Get("X-Sum"), replay.Header.Get("X-Sum"))
	assert.Equal(t, "abc", first.Trailer.Get("X-Sum"))
	assert.Equal(t, first.Trailer.Get("X-Sum"), replay.Trailer.Get("X-Sum"))
}

// "Trailer: Content-Type" is not a valid trailer: net/http ignores the
// declaration and sends Content-Type as a header, and so does the replay.
func TestInvalidTrailerDeclarationKeepsTheHeaders(t *testing.T) {
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Trailer", "Content-Type, Cache-Control")
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"a":1}`)
	}), idemhttp.Options{Unscoped: true})
	first, _ := post(t, srv.Client(), srv.URL, "k", "{}")
	second, _ := post(t, srv.Client(), srv.URL, "k", "{}")
	require.Equal(t, "true", second.Header.Get(idemhttp.ReplayedHeader))
	assert.Equal(t, "application/json", first.Header.Get("Content-Type"))
	assert.Equal(t, first.Header.Get("Content-Type"), second.Header.Get("Content-Type"))
	assert.Equal(t, first.Header.Get("Cache-Control"), second.Header.Get("Cache-Control"))
}
