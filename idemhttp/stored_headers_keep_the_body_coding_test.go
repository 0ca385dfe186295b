package idemhttp_test

import (
	"compress/gzip"
	"net/http"
	"testing"

	"github.com/seed094d4201/idem/idemhttp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The headers that say what the stored body's bytes are (Content-Encoding,
// Content-Range) are remembered with the body whatever StoredHeaders and
// SkipHeaders say: with StoredHeaders naming neither, a gzip middleware's
// body was replayed as its gzip bytes without Content-Encoding, garbage
// to the client that read the first answer as JSON.
func TestStoredHeadersKeepTheBodysCoding(t *testing.T) {
	for name, opts := range map[string]idemhttp.Options{
		"StoredHeaders": {Unscoped: true, StoredHeaders: []string{"Location", "Content-Type"}},
		"SkipHeaders":   {Unscoped: true, SkipHeaders: []string{"Content-Encoding", "Content-Range"}},
	} {
		t.Run(name, func(t *testing.T) {
			srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				w.Header().Set("Content-Encoding", "gzip")
				w.WriteHeader(http.StatusCreated)
				zw := gzip.NewWriter(w)
				_, _ = zw.Write([]byte(`{"ok":true}`))
				_ = zw.Close()
			}), opts)
			first, body := post(t, srv.Client(), srv.URL, "k", "x")
			require.Equal(t, http.StatusCreated, first.StatusCode)
			require.Equal(t, `{"ok":true}`, body)
			again, body := post(t, srv.Client(), srv.URL, "k", "x")
			require.Equal(t, "true", again.Header.Get(idemhttp.ReplayedHeader))
			assert.Equal(t, `{"ok":true}`, body, "the replay's body is the first answer's")
		})
	}
}
