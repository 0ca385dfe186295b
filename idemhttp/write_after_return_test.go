package idemhttp_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemhttp"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/seed094d4201/idem/sqlite"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// completeGate is a backend whose Complete calls entered, then waits for
// gate: the window between a handler's return and its outcome being
// recorded.
type completeGate struct {
	*idemtest.MemoryBackend
	entered func()
	gate    <-chan struct{}
}

func (b *completeGate) Complete(ctx context.Context, rec backend.Record, now time.Time, ttl time.Duration) error {
	b.entered()
	<-b.gate
	return b.MemoryBackend.Complete(ctx, rec, now, ttl)
}

// A handler's goroutine that writes after the handler returned (a bug
// net/http forbids, but one the middleware may meet) is refused, with
// the write's error: the first client's answer is the response the
// handler returned with, the one recorded and replayed. The late bytes
// went to the first client alone (before its outcome was recorded, or,
// in the transactional mode, after its commit: the held body grew), so
// its body differed from every replay's.
func TestWriteAfterTheHandlerReturnedIsRefused(t *testing.T) {
	for _, tx := range []bool{false, true} {
		name := "plain"
		if tx {
			name = "transactional"
		}
		t.Run(name, func(t *testing.T) {
			// returned is closed once the middleware has the handler's
			// return behind it (its outcome is being recorded), not in the
			// handler's own defer, which runs before the handler returns.
			returned, wrote := make(chan struct{}), make(chan struct{})
			var once sync.Once
			markReturned := func() { once.Do(func() { close(returned) }) }
			lateErr := make(chan error, 1)
			handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(http.StatusCreated)
				_, _ = io.WriteString(w, "body")
				go func() {
					<-returned
					_, err := io.WriteString(w, "+late")
					lateErr <- err
					close(wrote)
				}()
			})
			opts := idemhttp.Options{Unscoped: true}
			var store *idem.Store[idemhttp.Response]
			if tx {
				db, err := sqlite.Open(filepath.Join(t.TempDir(), "keys.db"))
				require.NoError(t, err)
				t.Cleanup(func() { db.Close() })
				b, err := sqlite.New(context.Background(), db, sqlite.Options{})
				require.NoError(t, err)
				store = newStore(t, idem.Options{Backend: b})
				opts.InTx = func(ctx context.Context, s *idem.Store[idemhttp.Response], key string, payload any, fn func(context.Context) (idemhttp.Response, error)) (idemhttp.Response, error) {
					resp, err := sqlite.InTx(ctx, s, key, payload, fn)
					markReturned()
					<-wrote // committed; the response not sent yet
					return resp, err
				}
			} else {
				store = newStore(t, idem.Options{Backend: &completeGate{MemoryBackend: idemtest.NewMemoryBackend(), entered: markReturned, gate: wrote}})
			}
			srv := httptest.NewServer(idemhttp.Middleware(store, opts)(handler))
			t.Cleanup(srv.Close)

			first, firstBody := post(t, srv.Client(), srv.URL, "k", "{}")
			assert.Equal(t, http.StatusCreated, first.StatusCode)
			assert.Equal(t, "body", firstBody, "the first client gets the response the handler returned with")
			assert.Error(t, <-lateErr, "the late write is told it failed")
			replay, replayBody := post(t, srv.Client(), srv.URL, "k", "{}")
			assert.Equal(t, "true", replay.Header.Get(idemhttp.ReplayedHeader))
			assert.Equal(t, "body", replayBody)
		})
	}
}
