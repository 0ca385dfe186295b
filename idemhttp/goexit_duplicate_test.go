package idemhttp_test

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemhttp"
	"github.com/stretchr/testify/assert"
)

// asking is a context that tells when its Done channel is first asked
// for: a duplicate asks for it as it starts to wait for the key in flight.
type asking struct {
	context.Context
	once  sync.Once
	asked chan struct{}
}

func (c *asking) Done() <-chan struct{} {
	c.once.Do(func() { close(c.asked) })
	return c.Context.Done()
}

// A duplicate that waited on a handler which ended its goroutine
// (runtime.Goexit) is answered as for a handler that panicked, 500, not
// 503 with "store unavailable" logged: the store is fine, the handler
// failed and its key is released.
func TestADuplicateOfAHandlerThatEndedItsGoroutineIsAnsweredAsForAPanic(t *testing.T) {
	var logs syncBuffer
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

	ctx := &asking{Context: context.Background(), asked: make(chan struct{})}
	var ran atomic.Bool
	w := httptest.NewRecorder()
	served := make(chan struct{})
	go func() {
		defer close(served)
		g.Serve(w, post(ctx), http.HandlerFunc(func(http.ResponseWriter, *http.Request) { ran.Store(true) }))
	}()
	<-ctx.asked
	close(gate)
	<-served
	assert.False(t, ran.Load(), "the duplicate ran the handler: it did not wait")
	assert.Equal(t, http.StatusInternalServerError, w.Code, w.Body.String())
	assert.NotContains(t, logs.String(), "store unavailable")
}

// syncBuffer is a bytes.Buffer safe for a logger's concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func newMemStore(t *testing.T) *idem.Store[idemhttp.Response] {
	s := idem.New[idemhttp.Response](idem.Options{})
	t.Cleanup(func() { s.Close() })
	return s
}
