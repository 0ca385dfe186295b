package idemgin_test

import (
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

// serveGin serves a gin app that setup builds, given the guard over a
// store of its own.
func serveGin(t *testing.T, setup func(r *gin.Engine, guard gin.HandlerFunc)) *httptest.Server {
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

// postKey posts body to url, with key as its Idempotency-Key unless
// empty.
func postKey(t *testing.T, url, key, body string) (*http.Response, string) {
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

// An outer middleware sees the same Status, Size and Written after the
// guard on the first call and on the replay; handlers after the guard do
// not run on a replay.
func TestOuterMiddlewareSeesTheSameWriterOnAReplay(t *testing.T) {
	type seen struct {
		status, size int
		written      bool
		aborted      bool
	}
	var got []seen
	var after atomic.Int32
	srv := serveGin(t, func(r *gin.Engine, guard gin.HandlerFunc) {
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
	first, b1 := postKey(t, srv.URL+"/charges", "k", "{}")
	retry, b2 := postKey(t, srv.URL+"/charges", "k", "{}")
	assert.Equal(t, first.StatusCode, retry.StatusCode)
	assert.Equal(t, b1, b2)
	assert.Equal(t, "1", retry.Header.Get("X-Late"))
	require.Len(t, got, 2)
	assert.Equal(t, got[0].status, got[1].status)
	assert.Equal(t, got[0].size, got[1].size)
	assert.Equal(t, got[0].written, got[1].written)
	assert.Equal(t, int32(1), after.Load())
}

// Panics with gin.Recovery outside the guard: a panic before writing is
// 500 and releases the key; after writing, the guard aborts the response
// (ErrAbortHandler), which gin.Recovery swallows, so the client may see
// it cut short rather than aborted.
func TestPanicUnderRecoveryReleasesTheKeyOrAbortsTheResponse(t *testing.T) {
	var runs atomic.Int32
	srv := serveGin(t, func(r *gin.Engine, guard gin.HandlerFunc) {
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
	first, _ := postKey(t, srv.URL+"/before", "k", "{}")
	assert.Equal(t, http.StatusInternalServerError, first.StatusCode)
	assert.Empty(t, first.Header.Get("Location"), "a Location for a charge that failed")
	retry, _ := postKey(t, srv.URL+"/before", "k", "{}")
	assert.Equal(t, http.StatusCreated, retry.StatusCode)

	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/after", strings.NewReader("{}"))
	req.Header.Set(idemhttp.Header, "k2")
	resp, err := http.DefaultClient.Do(req)
	if err == nil {
		b, rerr := io.ReadAll(resp.Body)
		resp.Body.Close()
		assert.Error(t, rerr, "a half-written response taken whole: %d %q", resp.StatusCode, b)
	}
}

// GET and HEAD pass through, every time.
func TestGetAndHeadPassThrough(t *testing.T) {
	var runs atomic.Int32
	srv := serveGin(t, func(r *gin.Engine, guard gin.HandlerFunc) {
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
