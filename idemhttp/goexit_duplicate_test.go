package idemhttp_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemhttp"
	"github.com/seed094d4201/idem/internal/faulttest"
	"github.com/stretchr/testify/assert"
)

// A duplicate that waited on a handler which ended its goroutine
// (runtime.Goexit) is answered as for a handler that panicked, 500, not
// 503 with "store unavailable" logged: the store is fine, the handler
// failed and its key is released.
func TestADuplicateOfAHandlerThatEndedItsGoroutineIsAnsweredAsForAPanic(t *testing.T) {
	var logs faulttest.LogBuffer
	g := idemhttp.NewGuard(newMemStore(t), idemhttp.Options{Unscoped: true, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	post := func(ctx context.Context) *http.Request {
		r := httptest.NewRequestWithContext(ctx, http.MethodPost, "/charges", strings.NewReader("{}"))
		r.Header.Set(idemhttp.Header, "k")
		return r
	}
	entered, gate := make(chan struct{}), make(chan struct{})
	go g.Serve(httptest.NewRecorder(), post(context.Background()), http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		close(entered)
		<-gate
		runtime.Goexit()
	}))
	<-entered

	ctx := faulttest.NewWaiting(context.Background())
	var ran atomic.Bool
	w := httptest.NewRecorder()
	served := make(chan struct{})
	go func() {
		defer close(served)
		g.Serve(w, post(ctx), http.HandlerFunc(func(http.ResponseWriter, *http.Request) { ran.Store(true) }))
	}()
	<-ctx.Asked
	close(gate)
	<-served
	assert.False(t, ran.Load(), "the duplicate ran the handler: it did not wait")
	assert.Equal(t, http.StatusInternalServerError, w.Code, w.Body.String())
	assert.NotContains(t, logs.String(), "store unavailable")
}

func newMemStore(t *testing.T) *idem.Store[idemhttp.Response] {
	s := idem.New[idemhttp.Response](idem.Options{})
	t.Cleanup(func() { s.Close() })
	return s
}
