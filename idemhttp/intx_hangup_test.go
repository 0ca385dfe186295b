package idemhttp_test

import (
	"bytes"
	"context"
	"log/slog"
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

// In the transactional mode, a request whose client hung up before its key
// was claimed is answered 409, as without it, and logs no error: a client
// can do this at will, and the store is fine (before: 503 "store
// unavailable" and an ERROR line, for a request that hung up at the wrong
// instant).
func TestTxModeClientGoneBeforeTheClaimIs409WithoutAnErrorLog(t *testing.T) {
	db, err := sqlite.Open(filepath.Join(t.TempDir(), "keys.db"))
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	b, err := sqlite.New(context.Background(), db, sqlite.Options{})
	require.NoError(t, err)
	store := idem.New[idemhttp.Response](idem.Options{Backend: b})
	t.Cleanup(func() { store.Close() })
	var logs bytes.Buffer
	ran := false
	h := idemhttp.Middleware(store, idemhttp.Options{
		Unscoped: true,
		InTx:     sqlite.InTx[idemhttp.Response],
		Logger:   slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
	})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { ran = true }))

	ctx, cancel := context.WithCancel(context.Background())
	cancel() // the client is gone before the key is claimed
	for range 50 {
		req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/charges", strings.NewReader(`{}`))
		req.Header.Set(idemhttp.Header, "gone-early")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		require.Equal(t, http.StatusConflict, w.Code, w.Body.String())
	}
	assert.False(t, ran, "the handler of a request whose client left before the claim never runs")
	assert.Empty(t, logs.String(), "nothing logged at Info or above")
}
