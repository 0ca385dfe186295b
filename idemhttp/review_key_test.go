package idemhttp_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/seed094d4201/idem/idemhttp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A key past ASCII that WithKey must quote (a comma, a leading quote or
// blank) crosses a real server as itself: the first request runs, the
// retry replays, and a key that differs only in the quoting's reason runs
// on its own. Before, the server refused the quoted value (400: "not
// printable ASCII") although the key is one idem accepts.
func TestReviewQuotedNonASCIIKeysRoundTrip(t *testing.T) {
	h := &charges{}
	srv := serve(t, h, idemhttp.Options{Unscoped: true})
	send := func(key string) (*http.Response, string) {
		req, err := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(`{"amount":1}`))
		require.NoError(t, err)
		resp, err := srv.Client().Do(idemhttp.WithKey(req, key))
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp, string(b)
	}
	keys := []string{"café,1", `"ünï`, " 注文", "注文 ", "注文"}
	for i, key := range keys {
		resp, body := send(key)
		require.Equal(t, http.StatusCreated, resp.StatusCode, "key %q: %s", key, body)
		again, replay := send(key)
		require.Equal(t, http.StatusCreated, again.StatusCode, "key %q: %s", key, replay)
		assert.Equal(t, "true", again.Header.Get(idemhttp.ReplayedHeader), "key %q was not read as the same key twice", key)
		assert.Equal(t, body, replay)
		assert.Equal(t, int32(i+1), h.n.Load(), "key %q ran again, or shared another key's run", key)
	}
}
