package idemhttp_test

import (
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemhttp"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/stretchr/testify/assert"
)

// With HashKeysInLogs, a short key is hidden where the error names it,
// and nowhere else: a key such as "e" once had every "e" of the logged
// error replaced by the hash, and the hash's own letters replaced again
// (the message a kilobyte of hashes, unreadable), and a key such as "key"
// had the "key" of the hash's own label replaced.
func TestAShortKeyLeavesTheLoggedErrorReadable(t *testing.T) {
	for _, key := range []string{"e", "a", "key", "sha", "5"} {
		for _, tc := range []struct {
			name string
			b    *keyNamingBackend
			h    http.HandlerFunc
			want string // the logged error, %s standing for the hidden key
		}{
			{"claim", &keyNamingBackend{MemoryBackend: idemtest.NewMemoryBackend(), claim: true}, func(w http.ResponseWriter, r *http.Request) {},
				"claiming key %s: connection reset"},
			{"release", &keyNamingBackend{MemoryBackend: idemtest.NewMemoryBackend(), release: true}, func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(http.StatusServiceUnavailable)
			}, "key %s: connection reset"},
		} {
			t.Run(key+"/"+tc.name, func(t *testing.T) {
				var logs strings.Builder
				store := idem.New[idemhttp.Response](idem.Options{Backend: tc.b, Logger: slog.New(slog.DiscardHandler), SettleTimeout: 50 * time.Millisecond})
				t.Cleanup(func() { store.Close() })
				h := idemhttp.Middleware(store, idemhttp.Options{
					Unscoped: true, HashKeysInLogs: true, Wait: 50 * time.Millisecond,
					Logger: slog.New(slog.NewTextHandler(&logs, nil)),
				})(tc.h)
				req := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader("{}"))
				req.Header.Set(idemhttp.Header, key)
				h.ServeHTTP(httptest.NewRecorder(), req)

				sum := sha256.Sum256([]byte(key))
				hidden := "key_sha256:" + hex.EncodeToString(sum[:])
				want := strings.ReplaceAll(tc.want, "%s", hidden)
				if tc.name == "release" {
					want = strings.ReplaceAll(tc.want, "%s", `\"`+hidden+`\"`) // %q, as text/slog quotes it
				}
				assert.Contains(t, logs.String(), want)
				assert.Less(t, logs.Len(), 600, "the logged error grew: %s", logs.String())
			})
		}
	}
}
