package idemhttp_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemhttp"
	"github.com/stretchr/testify/assert"
)

// stalledBody records the buffer its first Read is offered, and ends.
type stalledBody struct{ offered int }

func (b *stalledBody) Read(p []byte) (int, error) {
	if b.offered == 0 {
		b.offered = len(p)
	}
	return 0, io.EOF
}

func (*stalledBody) Close() error { return nil }

// A request that declares a body of MaxRequestBody bytes costs the server
// no buffer of that size before the bytes arrive: a client that sends
// the headers alone and stalls (one per connection, for as long as the
// server lets a read wait) held the whole declared size each, a megabyte
// for a hundred bytes sent. The buffer grows as the body comes.
func TestDeclaredBodyIsNotAllocatedBeforeItArrives(t *testing.T) {
	store := idem.New[idemhttp.Response](idem.Options{})
	t.Cleanup(func() { store.Close() })
	h := idemhttp.Middleware(store, idemhttp.Options{Unscoped: true, MaxRequestBody: 8 << 20})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	body := &stalledBody{}
	r := httptest.NewRequest(http.MethodPost, "/orders", nil)
	r.Body, r.ContentLength = body, 8<<20
	r.Header.Set(idemhttp.Header, "k")
	h.ServeHTTP(httptest.NewRecorder(), r)
	assert.Positive(t, body.offered)
	assert.LessOrEqual(t, body.offered, 64<<10, "a buffer of the declared size, before any of it arrived")
}
