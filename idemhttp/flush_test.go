package idemhttp_test

import (
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/seed094d4201/idem/idemhttp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A handler that flushes its headers and writes no body has answered 200
// (net/http sent it): it is remembered, and never runs again.
func TestFlushWithoutBodyIsRemembered(t *testing.T) {
	var runs atomic.Int32
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.Header().Set("Location", "/charges/1")
		http.NewResponseController(w).Flush()
	}), idemhttp.Options{})
	first, _ := post(t, srv.Client(), srv.URL, "k", "{}")
	require.Equal(t, http.StatusOK, first.StatusCode)
	retry, _ := post(t, srv.Client(), srv.URL, "k", "{}")
	assert.Equal(t, int32(1), runs.Load(), "the handler finished with 200: it must never run again")
	assert.Equal(t, http.StatusOK, retry.StatusCode)
}

// Flush before WriteHeader sends 200, and net/http ignores the later
// WriteHeader: the replay tells the status the client got.
func TestFlushThenWriteHeaderReplaysTheStatusSent(t *testing.T) {
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.NewResponseController(w).Flush()
		w.WriteHeader(http.StatusAccepted)
		io.WriteString(w, "queued")
	}), idemhttp.Options{})
	first, _ := post(t, srv.Client(), srv.URL, "k", "{}")
	retry, _ := post(t, srv.Client(), srv.URL, "k", "{}")
	assert.Equal(t, first.StatusCode, retry.StatusCode, "a replay tells the status the client got")
}

// Duplicates of a request whose response is streamed, waiting while it
// streams or coming after: the handler runs once, and every one is
// answered with its status.
func TestDuplicatesOfAStreamedResponseAreAllAnswered(t *testing.T) {
	var runs atomic.Int32
	gate := make(chan struct{})
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "a")
		http.NewResponseController(w).Flush()
		<-gate
		io.WriteString(w, "b")
	}), idemhttp.Options{MaxWaiters: 19})
	var wg sync.WaitGroup
	codes := make(chan int, 20)
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("{}"))
			req.Header.Set(idemhttp.Header, "k")
			resp, err := srv.Client().Do(req)
			if err != nil {
				codes <- -1
				return
			}
			io.ReadAll(resp.Body)
			resp.Body.Close()
			codes <- resp.StatusCode
		}()
	}
	for runs.Load() == 0 {
		yield()
	}
	close(gate)
	wg.Wait()
	close(codes)
	for c := range codes {
		assert.Equal(t, http.StatusCreated, c)
	}
	assert.Equal(t, int32(1), runs.Load())
}
