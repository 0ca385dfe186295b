package idemecho_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/labstack/echo/v4"
	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemhttp"
	"github.com/seed094d4201/idem/idemhttp/idemecho"
	"github.com/seed094d4201/idem/sqlite"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// In the transactional mode an echo handler's row, its key and its
// response commit together: the client gets the handler's own status and
// body, sent after the commit, and a retry replays them. A handler that
// fails (an error echo renders as a 5xx) has its row rolled back with the
// claim, and the retry runs it again.
func TestInTx(t *testing.T) {
	db, err := sqlite.Open(filepath.Join(t.TempDir(), "charges.db"))
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	b, err := sqlite.New(context.Background(), db, sqlite.Options{})
	require.NoError(t, err)
	_, err = db.Exec(`CREATE TABLE charges (id INTEGER PRIMARY KEY AUTOINCREMENT)`)
	require.NoError(t, err)
	store := idem.New[idemhttp.Response](idem.Options{Backend: b})
	t.Cleanup(func() { store.Close() })
	count := func() int {
		var n int
		require.NoError(t, db.QueryRow(`SELECT count(*) FROM charges`).Scan(&n))
		return n
	}
	charge := func(c echo.Context) (int64, error) {
		tx, ok := sqlite.TxFromContext(c.Request().Context())
		if !ok {
			return 0, errors.New("no transaction in the handler's context")
		}
		var id int64
		err := tx.QueryRowContext(c.Request().Context(), `INSERT INTO charges DEFAULT VALUES RETURNING id`).Scan(&id)
		return id, err
	}

	var runs atomic.Int32
	e := echo.New()
	g := e.Group("", idemecho.Middleware(store, idemecho.Options{HTTP: idemhttp.Options{
		Unscoped: true,
		InTx:     sqlite.InTx[idemhttp.Response],
		Logger:   slog.New(slog.NewTextHandler(io.Discard, nil)),
	}}))
	ok := func(c echo.Context) error {
		id, err := charge(c)
		if err != nil {
			return err
		}
		c.Response().Header().Set("Location", fmt.Sprintf("/charges/%d", id))
		return c.JSON(http.StatusCreated, map[string]int64{"charge": id})
	}
	g.POST("/charges", func(c echo.Context) error { runs.Add(1); return ok(c) })
	g.POST("/down", func(c echo.Context) error {
		if runs.Add(1) > 1 {
			return ok(c)
		}
		if _, err := charge(c); err != nil {
			return err
		}
		return echo.NewHTTPError(http.StatusBadGateway, "bank down")
	})
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)
	post := func(path string) (*http.Response, string) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader("{}"))
		req.Header.Set(idemhttp.Header, "k"+path)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp, string(body)
	}

	first, body := post("/charges")
	assert.Equal(t, http.StatusCreated, first.StatusCode, body)
	assert.JSONEq(t, `{"charge":1}`, body)
	assert.Equal(t, "/charges/1", first.Header.Get("Location"))
	retry, rbody := post("/charges")
	assert.Equal(t, http.StatusCreated, retry.StatusCode)
	assert.Equal(t, body, rbody)
	assert.Equal(t, "/charges/1", retry.Header.Get("Location"))
	assert.Equal(t, "true", retry.Header.Get(idemhttp.ReplayedHeader))
	assert.Equal(t, int32(1), runs.Load())
	assert.Equal(t, 1, count())

	runs.Store(0)
	failed, fbody := post("/down")
	assert.Equal(t, http.StatusBadGateway, failed.StatusCode, fbody)
	assert.Contains(t, fbody, "bank down")
	assert.Equal(t, 1, count(), "the failed handler's row was rolled back")
	again, abody := post("/down")
	assert.Equal(t, http.StatusCreated, again.StatusCode, abody)
	assert.Empty(t, again.Header.Get(idemhttp.ReplayedHeader))
	assert.Equal(t, int32(2), runs.Load(), "the retry ran the handler")
	assert.Equal(t, 2, count())
}
