package idemhttp_test

import (
	"context"
	"errors"
	"log/slog"
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
	"github.com/stretchr/testify/require"
)

// A key an operator settled with a final error (idem resolve -error,
// Store.Resolve with an error) is answered 500, without Retry-After and
// without the handler running, as the final outcome it is: not 503 "the
// store cannot be checked, retry", which had every retry (idemhttp's
// Transport's among them) come back for the same answer until the record
// expired, each one logged at Error as a store failure.
func TestFinalErrorOutcomeIsNotAStoreFailure(t *testing.T) {
	b := idemtest.NewMemoryBackend()
	store := idem.New[idemhttp.Response](idem.Options{Backend: b})
	t.Cleanup(func() { store.Close() })
	var logs strings.Builder
	ran := false
	h := idemhttp.Middleware(store, idemhttp.Options{
		Unscoped: true,
		Logger:   slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
	})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { ran = true }))
	request := func() *http.Request {
		r := httptest.NewRequest(http.MethodPost, "/refunds", strings.NewReader(`{"order":7}`))
		r.Header.Set(idemhttp.Header, "refund-7")
		return r
	}

	// An interrupted claim of the request's (its owner died), which the
	// operator settles: the refund was made by hand, and failed for good.
	reqFP, err := idemhttp.RequestFingerprint(request(), []byte(`{"order":7}`))
	require.NoError(t, err)
	fp, err := idem.DefaultFingerprint(reqFP[:]) // the payload the middleware claims with
	require.NoError(t, err)
	ctx := context.Background()
	key := idemhttp.StoreKey("", "refund-7")
	_, claimed, err := b.Claim(ctx, backend.Record{Key: key, Fingerprint: fp, Token: "dead-owner", State: backend.StatePending},
		time.Now().Add(-time.Hour), time.Millisecond)
	require.NoError(t, err)
	require.True(t, claimed)
	require.NoError(t, store.Resolve(ctx, key, idemhttp.Response{}, errors.New("refunded by hand; card closed")))

	for range 2 {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, request())
		assert.Equal(t, http.StatusInternalServerError, w.Code, w.Body.String())
		assert.Empty(t, w.Header().Get("Retry-After"), "a final outcome is not worth retrying")
		assert.NotContains(t, w.Body.String(), "card closed", "the operator's message stays in the store")
	}
	assert.False(t, ran)
	assert.Empty(t, logs.String(), "a client can ask again at will: nothing logged at Info or above")
}
