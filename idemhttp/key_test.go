package idemhttp_test

import (
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemhttp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A key past ASCII that WithKey must quote (a comma, a leading quote or
// blank) crosses a real server as itself: the first request runs, the
// retry replays, and a key that differs only in the quoting's reason runs
// on its own.
func TestQuotedNonASCIIKeysRoundTrip(t *testing.T) {
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

// Keys that differ only by a blank at an end are two keys: WithKey quotes
// the one with the blank, so the server's header parsing, which trims
// blanks, does not make them one.
func TestKeysDifferingInBlanksAreTwoKeys(t *testing.T) {
	srv := serve(t, &charges{}, idemhttp.Options{Unscoped: true})
	client := &http.Client{Transport: &idemhttp.Transport{Base: srv.Client().Transport}}
	send := func(key, body string) int {
		req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(body))
		resp, err := client.Do(idemhttp.WithKey(req, key))
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	require.NoError(t, idem.CheckKey("order-7 "))
	assert.Equal(t, http.StatusCreated, send("order-7", `{"a":1}`))
	assert.Equal(t, http.StatusCreated, send("order-7 ", `{"a":2}`), "a different key, refused as the same")
}

// A key that holds a comma, sent by the package's own client, is the one
// key its own server reads, not "a list of keys".
func TestWithKeyCommaKeyReachesItsOwnServer(t *testing.T) {
	var runs atomic.Int32
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
	}), idemhttp.Options{Unscoped: true})
	key := "order-1,line-2" // idem.CheckKey accepts it
	require.NoError(t, idem.CheckKey(key))
	req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("{}"))
	client := &http.Client{Transport: &idemhttp.Transport{}}
	resp, err := client.Do(idemhttp.WithKey(req, key))
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusCreated, resp.StatusCode, "the library's own client and server disagree on a valid key")
	assert.Equal(t, int32(1), runs.Load())
}
