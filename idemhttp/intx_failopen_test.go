package idemhttp_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemhttp"
	"github.com/seed094d4201/idem/sqlite"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// FailOpen does not apply in the transactional mode: with the store's
// database down, a request is answered 503 with Retry-After, and its
// handler, which would have written through a transaction that does not
// exist, never runs unguarded.
func TestTxModeWithFailOpenAndTheDatabaseDownIs503WithoutRunning(t *testing.T) {
	db, err := sqlite.Open(filepath.Join(t.TempDir(), "keys.db"))
	require.NoError(t, err)
	b, err := sqlite.New(context.Background(), db, sqlite.Options{})
	require.NoError(t, err)
	store := idem.New[idemhttp.Response](idem.Options{Backend: b})
	t.Cleanup(func() { store.Close() })
	runs := 0
	h := idemhttp.Middleware(store, idemhttp.Options{
		Unscoped: true,
		FailOpen: true,
		InTx:     sqlite.InTx[idemhttp.Response],
		Logger:   quiet(),
	})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs++
		_, inTx := sqlite.TxFromContext(r.Context())
		assert.True(t, inTx, "a guarded handler runs in its transaction")
		w.WriteHeader(http.StatusCreated)
	}))
	require.NoError(t, db.Close()) // the database is down

	req := httptest.NewRequest(http.MethodPost, "/charges", strings.NewReader(`{}`))
	req.Header.Set(idemhttp.Header, "k")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	assert.Equal(t, http.StatusServiceUnavailable, w.Code, w.Body.String())
	assert.NotEmpty(t, w.Header().Get("Retry-After"))
	assert.Zero(t, runs, "the handler never runs unguarded in the transactional mode")
}
