package idemgin_test

import (
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemhttp"
	"github.com/seed094d4201/idem/idemhttp/idemgin"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func reviewServer(t *testing.T, setup func(r *gin.Engine, guard gin.HandlerFunc)) *httptest.Server {
	t.Helper()
	gin.SetMode(gin.TestMode)
	store := idem.New[idemhttp.Response](idem.Options{})
	t.Cleanup(func() { store.Close() })
	r := gin.New()
	setup(r, idemgin.Middleware(store, idemgin.Options{HTTP: idemhttp.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}}))
	srv := httptest.NewServer(r)
	t.Cleanup(srv.Close)
	return srv
}

func reviewPost(t *testing.T, url, key, body string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if key != "" {
		req.Header.Set(idemhttp.Header, key)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// gin's idiom for errors: the handler calls c.Error and returns, and an
// error middleware earlier in the chain writes the response after c.Next.
// Without the guard that middleware answers 402; with it, the adapter
// sends an empty 200 first, remembers it, and replays it.
func TestHostileGinErrorMiddlewareOutsideGuard(t *testing.T) {
	var runs atomic.Int32
	errDeclined := errors.New("card declined")
	srv := reviewServer(t, func(r *gin.Engine, guard gin.HandlerFunc) {
		r.Use(func(c *gin.Context) { // the app's error middleware
			c.Next()
			if len(c.Errors) > 0 && !c.Writer.Written() {
				c.JSON(http.StatusPaymentRequired, gin.H{"error": c.Errors.Last().Error()})
			}
		})
		r.POST("/bare", func(c *gin.Context) { _ = c.Error(errDeclined) })
		r.POST("/charges", guard, func(c *gin.Context) { runs.Add(1); _ = c.Error(errDeclined) })
	})
	bare, bareBody := reviewPost(t, srv.URL+"/bare", "", "{}")
	require.Equal(t, http.StatusPaymentRequired, bare.StatusCode, bareBody)

	first, body := reviewPost(t, srv.URL+"/charges", "k", "{}")
	assert.Equal(t, http.StatusPaymentRequired, first.StatusCode, "the guard changes the app's answer: %q", body)
	retry, rbody := reviewPost(t, srv.URL+"/charges", "k", "{}")
	t.Logf("first: %d %q; retry: %d %q replayed=%q", first.StatusCode, body, retry.StatusCode, rbody, retry.Header.Get(idemhttp.ReplayedHeader))
	assert.Equal(t, first.StatusCode, retry.StatusCode, "the replay's status differs from what the client got")
	assert.Equal(t, body, rbody, "the replay's body differs from what the client got")
}

// c.Stream (SSE) inside the guard: one run, a replay without body.
func TestHostileGinStream(t *testing.T) {
	var runs atomic.Int32
	srv := reviewServer(t, func(r *gin.Engine, guard gin.HandlerFunc) {
		r.POST("/events", guard, func(c *gin.Context) {
			runs.Add(1)
			i := 0
			c.Stream(func(w io.Writer) bool {
				c.SSEvent("tick", i)
				i++
				return i < 3
			})
		})
	})
	first, body := reviewPost(t, srv.URL+"/events", "k", "{}")
	assert.Equal(t, http.StatusOK, first.StatusCode)
	assert.Contains(t, body, "tick")
	retry, _ := reviewPost(t, srv.URL+"/events", "k", "{}")
	assert.Equal(t, int32(1), runs.Load())
	assert.Equal(t, http.StatusOK, retry.StatusCode)
	assert.Equal(t, "streamed", retry.Header.Get(idemhttp.BodyOmittedHeader))
}

// An outer middleware sees the same Status, Size and Written after the
// guard on the first call and on the replay; handlers after the guard do
// not run on a replay.
func TestHostileGinWriterAfterGuard(t *testing.T) {
	type seen struct {
		status, size int
		written      bool
		aborted      bool
	}
	var got []seen
	var after atomic.Int32
	srv := reviewServer(t, func(r *gin.Engine, guard gin.HandlerFunc) {
		r.Use(func(c *gin.Context) {
			c.Next()
			got = append(got, seen{c.Writer.Status(), c.Writer.Size(), c.Writer.Written(), c.IsAborted()})
		})
		r.POST("/charges", guard, func(c *gin.Context) { after.Add(1); c.Next() }, func(c *gin.Context) {
			c.Header("X-Late", "1")
			c.String(http.StatusCreated, "charged")
			c.Abort()
		})
	})
	first, b1 := reviewPost(t, srv.URL+"/charges", "k", "{}")
	retry, b2 := reviewPost(t, srv.URL+"/charges", "k", "{}")
	assert.Equal(t, first.StatusCode, retry.StatusCode)
	assert.Equal(t, b1, b2)
	assert.Equal(t, "1", retry.Header.Get("X-Late"))
	require.Len(t, got, 2)
	assert.Equal(t, got[0].status, got[1].status)
	assert.Equal(t, got[0].size, got[1].size)
	assert.Equal(t, got[0].written, got[1].written)
	assert.Equal(t, int32(1), after.Load())
	t.Logf("seen: %+v", got)
}

// Panics with gin.Recovery outside the guard.
func TestHostileGinPanicRecovery(t *testing.T) {
	var runs atomic.Int32
	srv := reviewServer(t, func(r *gin.Engine, guard gin.HandlerFunc) {
		r.Use(gin.CustomRecoveryWithWriter(io.Discard, func(c *gin.Context, err any) { c.AbortWithStatus(599) }))
		r.POST("/before", guard, func(c *gin.Context) {
			if runs.Add(1) == 1 {
				c.Header("Location", "/charges/1")
				panic("boom")
			}
			c.String(http.StatusCreated, "ok")
		})
		r.POST("/after", guard, func(c *gin.Context) {
			c.Status(http.StatusCreated)
			c.Writer.WriteString("part one")
			panic("boom")
		})
	})
	first, body := reviewPost(t, srv.URL+"/before", "k", "{}")
	t.Logf("panic before write: %d %v %q", first.StatusCode, first.Header, body)
	assert.Equal(t, http.StatusInternalServerError, first.StatusCode)
	assert.Empty(t, first.Header.Get("Location"), "a Location for a charge that failed")
	retry, _ := reviewPost(t, srv.URL+"/before", "k", "{}")
	assert.Equal(t, http.StatusCreated, retry.StatusCode)

	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/after", strings.NewReader("{}"))
	req.Header.Set(idemhttp.Header, "k2")
	resp, err := http.DefaultClient.Do(req)
	if err == nil {
		b, rerr := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Logf("panic after write: client sees %d %q (read err %v): a truncated response taken as whole", resp.StatusCode, b, rerr)
		assert.Error(t, rerr, "the guard aborts a half-written response, but gin.Recovery swallows ErrAbortHandler")
	}
}

// GET and HEAD pass through, every time.
func TestHostileGinPassthrough(t *testing.T) {
	var runs atomic.Int32
	srv := reviewServer(t, func(r *gin.Engine, guard gin.HandlerFunc) {
		r.Use(guard)
		r.GET("/x", func(c *gin.Context) { runs.Add(1); c.JSON(200, gin.H{"n": runs.Load()}) })
		r.HEAD("/x", func(c *gin.Context) { runs.Add(1); c.Status(204) })
	})
	for _, m := range []string{"GET", "GET", "HEAD"} {
		req, _ := http.NewRequest(m, srv.URL+"/x", nil)
		req.Header.Set(idemhttp.Header, "k")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Empty(t, resp.Header.Get(idemhttp.ReplayedHeader))
	}
	assert.Equal(t, int32(3), runs.Load())
}
