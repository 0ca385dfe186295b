package idemhttp_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemhttp"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/stretchr/testify/assert"
)

// getPanics is a Backend whose Get panics.
type getPanics struct{ *idemtest.MemoryBackend }

func (getPanics) Get(context.Context, string, time.Time) (backend.Record, bool, error) {
	panic("Get panicked")
}

// After a transaction that did not commit, the middleware reads the key's
// record to tell a handler's own COMMIT from a failed one; that read goes
// through the store's guard like every other call into a Backend, so a
// Backend whose Get panics makes the request 503, and no panic escapes
// (before: the panic went up through ServeHTTP).
func TestTxModeReadOfAPanickingBackendIsGuarded(t *testing.T) {
	store := idem.New[idemhttp.Response](idem.Options{Backend: getPanics{idemtest.NewMemoryBackend()}})
	t.Cleanup(func() { store.Close() })
	inTx := func(ctx context.Context, _ *idem.Store[idemhttp.Response], _ string, _ any, fn func(context.Context) (idemhttp.Response, error)) (idemhttp.Response, error) {
		resp, _ := fn(ctx)
		return resp, errors.New("the commit failed")
	}
	h := idemhttp.Middleware(store, idemhttp.Options{Unscoped: true, InTx: inTx, Logger: quiet()})(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) }))
	req := httptest.NewRequest(http.MethodPost, "/", strings.NewReader("{}"))
	req.Header.Set(idemhttp.Header, "k")
	w := httptest.NewRecorder()
	assert.NotPanics(t, func() { h.ServeHTTP(w, req) })
	assert.Equal(t, http.StatusServiceUnavailable, w.Code, w.Body.String())
}
