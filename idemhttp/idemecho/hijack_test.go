package idemecho_test

import (
	"io"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/labstack/echo/v4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A handler that upgrades the connection the way WebSocket libraries do
// (101 Switching Protocols through the Response, then Hijack) answered
// on it: it is remembered as done, and a retry replays that it ran.
func TestUpgradedHandlerIsNotRunAgain(t *testing.T) {
	var runs atomic.Int32
	srv := serveEcho(t, func(e *echo.Echo, guard echo.MiddlewareFunc) {
		e.POST("/upgrade", func(c echo.Context) error {
			runs.Add(1)
			c.Response().Header().Set("Connection", "Upgrade")
			c.Response().Header().Set("Upgrade", "tcp")
			c.Response().WriteHeader(http.StatusSwitchingProtocols)
			conn, rw, err := c.Response().Hijack()
			if err != nil {
				return err
			}
			io.WriteString(rw, "on the connection")
			rw.Flush()
			return conn.Close()
		}, guard)
	})
	postKey(t, srv.URL+"/upgrade", "k") // its answer is its own
	retry, body, err := postKey(t, srv.URL+"/upgrade", "k")
	require.NoError(t, err)
	assert.Equal(t, int32(1), runs.Load(), "the handler ran again")
	assert.Equal(t, http.StatusOK, retry.StatusCode)
	assert.Equal(t, "hijacked", retry.Header.Get("Idempotent-Body-Omitted"))
	assert.Empty(t, body)
}

// A handler that takes the connection over and then panics, under a
// recover middleware, failed before commit: its key is released and a
// retry runs it again.
func TestHijackedHandlerThatPanicsIsReleased(t *testing.T) {
	var runs atomic.Int32
	srv := serveEcho(t, func(e *echo.Echo, guard echo.MiddlewareFunc) {
		e.Use(recoverLikeEcho)
		e.POST("/attach", func(c echo.Context) error {
			if runs.Add(1) > 1 {
				return c.NoContent(http.StatusCreated)
			}
			conn, _, err := c.Response().Hijack()
			if err != nil {
				return err
			}
			conn.Close()
			panic("after the hijack")
		}, guard)
	})
	_, _, err := postKey(t, srv.URL+"/attach", "k")
	assert.Error(t, err, "the connection was closed unanswered")
	// A retry that came while the key was still held waited for the
	// panic and was told so; the next runs the handler again.
	retry, _, err := postKey(t, srv.URL+"/attach", "k")
	require.NoError(t, err)
	if retry.StatusCode == http.StatusInternalServerError {
		retry, _, err = postKey(t, srv.URL+"/attach", "k")
		require.NoError(t, err)
	}
	assert.Equal(t, http.StatusCreated, retry.StatusCode)
	assert.Equal(t, int32(2), runs.Load())
}
