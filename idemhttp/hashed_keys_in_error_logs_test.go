package idemhttp_test

import (
	"context"
	"fmt"
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

// keyNamingBackend fails as the SQL backends do, with errors that name
// the key they were about, quoted (postgres: `key "0::k" is held by a
// transaction still open`) or not.
type keyNamingBackend struct {
	*idemtest.MemoryBackend
	claim, release bool
}

func (b *keyNamingBackend) Claim(ctx context.Context, rec backend.Record, now time.Time, lease time.Duration) (backend.Record, bool, error) {
	if b.claim {
		return backend.Record{}, false, fmt.Errorf("claiming key %s: connection reset", rec.Key)
	}
	return b.MemoryBackend.Claim(ctx, rec, now, lease)
}

func (b *keyNamingBackend) Release(ctx context.Context, key, token string) error {
	if b.release {
		return fmt.Errorf("key %q: connection reset", key)
	}
	return b.MemoryBackend.Release(ctx, key, token)
}

// With HashKeysInLogs, no log line carries the Idempotency-Key, its
// errors included: a backend's error that names the store key (as
// PostgreSQL's and MySQL's do, quoted with its escapes or not) has it
// replaced by its hash, where the middleware logs it.
func TestHashedKeysStayOutOfLoggedErrors(t *testing.T) {
	const key = `alice@example.com "vip" order`
	for _, tc := range []struct {
		name string
		b    *keyNamingBackend
		h    http.HandlerFunc
	}{
		{"claim", &keyNamingBackend{MemoryBackend: idemtest.NewMemoryBackend(), claim: true}, func(w http.ResponseWriter, r *http.Request) {}},
		{"release", &keyNamingBackend{MemoryBackend: idemtest.NewMemoryBackend(), release: true}, func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusServiceUnavailable)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs strings.Builder
			store := idem.New[idemhttp.Response](idem.Options{Backend: tc.b, Logger: slog.New(slog.DiscardHandler), SettleTimeout: 50 * time.Millisecond})
			t.Cleanup(func() { store.Close() })
			h := idemhttp.Middleware(store, idemhttp.Options{
				Unscoped: true, HashKeysInLogs: true, Wait: 50 * time.Millisecond,
				Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
			})(tc.h)
			req := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader("{}"))
			req.Header.Set(idemhttp.Header, `"`+strings.ReplaceAll(key, `"`, `\"`)+`"`)
			h.ServeHTTP(httptest.NewRecorder(), req)
			require.NotEmpty(t, logs.String(), "the failure is logged")
			assert.Contains(t, logs.String(), "key_sha256=")
			for _, part := range []string{"alice@example.com", "vip"} {
				assert.NotContains(t, logs.String(), part, "a log line carries the key")
			}
		})
	}
}
