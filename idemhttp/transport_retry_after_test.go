package idemhttp_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed094d4201/idem/idemhttp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Retry-After values that are not a wait the Transport can honour within
// MaxWait: one it cannot read is no ask (retried after the backoff), a
// past date is no wait, and one too long for MaxWait, a number too large
// for any duration included, returns the answer to the caller.
func TestTransportReadsOddRetryAfterValues(t *testing.T) {
	for _, tc := range []struct {
		retryAfter string
		status     int
		attempts   int32
	}{
		{"-5", http.StatusOK, 2},
		{"garbage", http.StatusOK, 2},
		{"1.5", http.StatusOK, 2},
		{"Mon, 01 Jan 1990 00:00:00 GMT", http.StatusOK, 2},
		{"99999999999999999999999", http.StatusServiceUnavailable, 1},
		{"3600", http.StatusServiceUnavailable, 1},
		{time.Now().Add(100 * 365 * 24 * time.Hour).UTC().Format(http.TimeFormat), http.StatusServiceUnavailable, 1},
	} {
		var n atomic.Int32
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if n.Add(1) == 1 {
				w.Header().Set("Retry-After", tc.retryAfter)
				w.WriteHeader(http.StatusServiceUnavailable)
				return
			}
			w.WriteHeader(http.StatusOK)
		}))
		client := &http.Client{Transport: &idemhttp.Transport{MinBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond, MaxWait: 2 * time.Second}}
		resp, err := client.Post(srv.URL, "application/json", strings.NewReader("{}"))
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, tc.status, resp.StatusCode, "Retry-After %q", tc.retryAfter)
		assert.Equal(t, tc.attempts, n.Load(), "Retry-After %q", tc.retryAfter)
		srv.Close()
	}
}
