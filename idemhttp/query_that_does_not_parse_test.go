package idemhttp_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/seed094d4201/idem/idemhttp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A query url.ParseQuery cannot read whole (a ';' separator, a bad
// escape) is fingerprinted as it was sent: ParseQuery drops the pairs it
// cannot read, so "?amount=100;memo" and "?amount=999;memo" fingerprinted
// alike, and a handler that reads the raw query (a proxy forwarding it)
// had its answer to one replayed to the other under the same key, not 422.
func TestQueryThatDoesNotParseIsFingerprintedAsSent(t *testing.T) {
	fp := func(target string) [32]byte {
		r := httptest.NewRequest(http.MethodPost, target, nil)
		f, err := idemhttp.RequestFingerprint(r, nil)
		require.NoError(t, err)
		return f
	}
	for _, pair := range [][2]string{
		{"/pay?amount=100;memo", "/pay?amount=999;memo"},
		{"/pay?amount=100&to=%zz1", "/pay?amount=100&to=%zz2"},
		{"/pay?to=a;b", "/pay"},
	} {
		assert.NotEqual(t, fp(pair[0]), fp(pair[1]), "%s and %s", pair[0], pair[1])
	}
	// A query that parses keeps its canonical form: order does not count.
	assert.Equal(t, fp("/pay?a=1&b=2"), fp("/pay?b=2&a=1"))
	assert.Equal(t, fp("/pay?a=%41"), fp("/pay?a=A"))
}
