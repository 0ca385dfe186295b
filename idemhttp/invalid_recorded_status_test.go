package idemhttp_test

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
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

// A recorded response whose status no response can have (an operator's
// idem resolve -result '{}' or '{"status":42}', which the command's shape
// check lets through, or Store.Resolve with a zero Response) is answered
// 500, logged for an operator: its replay called WriteHeader(0), and
// net/http's panic escaped the middleware. An informational status (1xx)
// is no final answer either: its replay went out as the 1xx, then a 200.
func TestRecordedResponseWithoutAValidStatusIs500(t *testing.T) {
	for _, status := range []int{0, 42, 103, 1000} {
		t.Run(strconv.Itoa(status), func(t *testing.T) {
			b := idemtest.NewMemoryBackend()
			store := idem.New[idemhttp.Response](idem.Options{Backend: b})
			t.Cleanup(func() { store.Close() })
			var logs bytes.Buffer
			h := idemhttp.Middleware(store, idemhttp.Options{
				Unscoped: true,
				Logger:   slog.New(slog.NewTextHandler(&logs, nil)),
			})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { t.Error("the handler ran") }))
			request := func() *http.Request {
				r := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{}`))
				r.Header.Set(idemhttp.Header, "order-7")
				return r
			}
			reqFP, err := idemhttp.RequestFingerprint(request(), []byte(`{}`))
			require.NoError(t, err)
			fp, err := idem.DefaultFingerprint(reqFP[:])
			require.NoError(t, err)
			ctx := context.Background()
			key := idemhttp.StoreKey("", "order-7")
			_, claimed, err := b.Claim(ctx, backend.Record{Key: key, Fingerprint: fp, Token: "dead-owner", State: backend.StatePending},
				time.Now().Add(-time.Hour), time.Millisecond)
			require.NoError(t, err)
			require.True(t, claimed)
			require.NoError(t, store.Resolve(ctx, key, idemhttp.Response{Status: status, Body: []byte("kept")}, nil))

			w := httptest.NewRecorder()
			require.NotPanics(t, func() { h.ServeHTTP(w, request()) })
			assert.Equal(t, http.StatusInternalServerError, w.Code)
			assert.NotContains(t, w.Body.String(), "kept")
			assert.Contains(t, logs.String(), "level=ERROR")
		})
	}
}
