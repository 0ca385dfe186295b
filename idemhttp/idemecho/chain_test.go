package idemecho_test

import (
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/labstack/echo/v4"
	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemhttp"
	"github.com/seed094d4201/idem/idemhttp/idemecho"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// serveEcho serves an echo app that setup builds, given the guard over
// a store of its own.
func serveEcho(t *testing.T, setup func(e *echo.Echo, guard echo.MiddlewareFunc)) *httptest.Server {
	t.Helper()
	store := idem.New[idemhttp.Response](idem.Options{})
	t.Cleanup(func() { store.Close() })
	e := echo.New()
	e.Logger.SetOutput(io.Discard)
	setup(e, idemecho.Middleware(store, idemecho.Options{HTTP: idemhttp.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}}))
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)
	return srv
}

// postKey posts {} to url, with key as its Idempotency-Key unless empty.
func postKey(t *testing.T, url, key string) (*http.Response, string, error) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader("{}"))
	if key != "" {
		req.Header.Set(idemhttp.Header, key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp, string(b), err
}

// A handler that wrote its response and then returned an error: the
// response stands, and is replayed as it was.
func TestResponseWrittenThenErrorIsReplayed(t *testing.T) {
	var runs atomic.Int32
	srv := serveEcho(t, func(e *echo.Echo, guard echo.MiddlewareFunc) {
		e.POST("/c", func(c echo.Context) error {
			runs.Add(1)
			c.Response().Header().Set("Location", "/charges/1")
			if err := c.JSON(http.StatusCreated, map[string]int{"charge": 1}); err != nil {
				return err
			}
			return errors.New("audit log failed after the charge")
		}, guard)
	})
	first, b1, err := postKey(t, srv.URL+"/c", "k")
	require.NoError(t, err)
	retry, b2, err := postKey(t, srv.URL+"/c", "k")
	require.NoError(t, err)
	assert.Equal(t, http.StatusCreated, first.StatusCode)
	assert.Equal(t, first.StatusCode, retry.StatusCode)
	assert.Equal(t, b1, b2)
	assert.Equal(t, int32(1), runs.Load())
}

// echo's Recover outside the guard: a panic before writing is 500 and the
// key is released; after writing, the response is aborted.
func TestPanicUnderRecoverReleasesTheKeyOrAbortsTheResponse(t *testing.T) {
	var runs atomic.Int32
	srv := serveEcho(t, func(e *echo.Echo, guard echo.MiddlewareFunc) {
		e.Use(recoverLikeEcho)
		e.POST("/before", func(c echo.Context) error {
			if runs.Add(1) == 1 {
				c.Response().Header().Set("Location", "/charges/1")
				panic("boom")
			}
			return c.String(http.StatusCreated, "ok")
		}, guard)
		e.POST("/after", func(c echo.Context) error {
			c.Response().WriteHeader(http.StatusCreated)
			io.WriteString(c.Response(), "part one")
			panic("boom")
		}, guard)
	})
	first, _, err := postKey(t, srv.URL+"/before", "k")
	require.NoError(t, err)
	assert.Equal(t, http.StatusInternalServerError, first.StatusCode)
	assert.Empty(t, first.Header.Get("Location"), "a Location for a charge that failed")
	retry, _, err := postKey(t, srv.URL+"/before", "k")
	require.NoError(t, err)
	assert.Equal(t, http.StatusCreated, retry.StatusCode)

	_, b, err := postKey(t, srv.URL+"/after", "k2")
	assert.Error(t, err, "a half-written response is aborted, not taken whole: %q", b)
}

// Outer middleware sees Status, Size and Committed after the guard, the same
// on the first call and the replay; the returned error is nil either way.
func TestOuterMiddlewareSeesTheSameResponseOnAReplay(t *testing.T) {
	type seen struct {
		status    int
		size      int64
		committed bool
		err       error
	}
	var got []seen
	srv := serveEcho(t, func(e *echo.Echo, guard echo.MiddlewareFunc) {
		e.Use(func(next echo.HandlerFunc) echo.HandlerFunc {
			return func(c echo.Context) error {
				err := next(c)
				r := c.Response()
				got = append(got, seen{r.Status, r.Size, r.Committed, err})
				return err
			}
		})
		e.POST("/c", func(c echo.Context) error {
			return echo.NewHTTPError(http.StatusPaymentRequired, "declined")
		}, guard)
	})
	first, b1, _ := postKey(t, srv.URL+"/c", "k")
	retry, b2, _ := postKey(t, srv.URL+"/c", "k")
	assert.Equal(t, http.StatusPaymentRequired, first.StatusCode)
	assert.Equal(t, first.StatusCode, retry.StatusCode)
	assert.Equal(t, b1, b2)
	require.Len(t, got, 2)
	assert.Equal(t, got[0].status, got[1].status)
	assert.Equal(t, got[0].size, got[1].size)
	assert.Equal(t, got[0].committed, got[1].committed)
	assert.NoError(t, got[0].err)
	assert.NoError(t, got[1].err)
}

// echo idiom: an outer middleware maps a domain error the handler returns
// into a response. The adapter writes the error with HTTPErrorHandler
// inside the guard, as its package doc says, so that mapping never sees
// it: the guarded route answers what HTTPErrorHandler makes of it (500
// for a plain error), where the bare route gets the mapping's 402.
func TestOuterErrorMappingDoesNotSeeTheGuardedHandlersError(t *testing.T) {
	errDeclined := errors.New("declined")
	srv := serveEcho(t, func(e *echo.Echo, guard echo.MiddlewareFunc) {
		e.Use(func(next echo.HandlerFunc) echo.HandlerFunc {
			return func(c echo.Context) error {
				if err := next(c); errors.Is(err, errDeclined) {
					return c.JSON(http.StatusPaymentRequired, map[string]string{"error": "declined"})
				} else {
					return err
				}
			}
		})
		e.POST("/bare", func(c echo.Context) error { return errDeclined })
		e.POST("/c", func(c echo.Context) error { return errDeclined }, guard)
	})
	bare, _, err := postKey(t, srv.URL+"/bare", "")
	require.NoError(t, err)
	assert.Equal(t, http.StatusPaymentRequired, bare.StatusCode)
	first, body, err := postKey(t, srv.URL+"/c", "k")
	require.NoError(t, err)
	assert.Equal(t, http.StatusInternalServerError, first.StatusCode, body)
	retry, rbody, err := postKey(t, srv.URL+"/c", "k")
	require.NoError(t, err)
	assert.Equal(t, first.StatusCode, retry.StatusCode, "released, and answered the same")
	assert.Equal(t, body, rbody)
}

// recoverLikeEcho is echo's middleware.Recover in short (that package needs
// a go.sum entry this module lacks): ErrAbortHandler goes on up.
func recoverLikeEcho(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		defer func() {
			if r := recover(); r != nil {
				if r == http.ErrAbortHandler {
					panic(r)
				}
				c.Error(errors.New("panic"))
			}
		}()
		return next(c)
	}
}
