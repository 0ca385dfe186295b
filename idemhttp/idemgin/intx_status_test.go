package idemgin_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemhttp"
	"github.com/seed094d4201/idem/idemhttp/idemgin"
	"github.com/seed094d4201/idem/sqlite"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// In the transactional mode a gin handler's status reaches the client
// that ran it, after the commit, and equals its replay's: a c.JSON(201)
// was sent as 200 (gin's default status, pushed out from inside the
// handler before the commit), while the retry replayed 201.
func TestInTxFirstAnswerHasTheHandlersStatus(t *testing.T) {
	gin.SetMode(gin.TestMode)
	db, err := sqlite.Open(filepath.Join(t.TempDir(), "charges.db"))
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	b, err := sqlite.New(context.Background(), db, sqlite.Options{})
	require.NoError(t, err)
	_, err = db.Exec(`CREATE TABLE charges (id INTEGER PRIMARY KEY AUTOINCREMENT)`)
	require.NoError(t, err)
	store := idem.New[idemhttp.Response](idem.Options{Backend: b})
	t.Cleanup(func() { store.Close() })
	charges := func() int {
		var n int
		require.NoError(t, db.QueryRow(`SELECT count(*) FROM charges`).Scan(&n))
		return n
	}
	charge := func(c *gin.Context) error {
		tx, ok := sqlite.TxFromContext(c.Request.Context())
		if !ok {
			return errors.New("no transaction in the handler's context")
		}
		_, err := tx.ExecContext(c.Request.Context(), `INSERT INTO charges DEFAULT VALUES`)
		return err
	}

	r := gin.New()
	g := r.Group("/", idemgin.Middleware(store, idemgin.Options{HTTP: idemhttp.Options{
		Unscoped: true,
		InTx:     sqlite.InTx[idemhttp.Response],
		Logger:   slog.New(slog.NewTextHandler(io.Discard, nil)),
	}}))
	g.POST("/json", func(c *gin.Context) {
		if err := charge(c); err != nil {
			c.String(http.StatusInternalServerError, err.Error())
			return
		}
		c.Header("Location", "/charges/1")
		c.JSON(http.StatusCreated, gin.H{"charge": 1})
	})
	g.POST("/status", func(c *gin.Context) {
		if err := charge(c); err != nil {
			c.String(http.StatusInternalServerError, err.Error())
			return
		}
		c.Status(http.StatusAccepted)
	})
	srv := httptest.NewServer(r)
	t.Cleanup(srv.Close)
	post := func(path, key string) (*http.Response, string) {
		req, err := http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader(`{}`))
		require.NoError(t, err)
		req.Header.Set(idemhttp.Header, key)
		resp, err := srv.Client().Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp, string(body)
	}

	for _, tc := range []struct {
		path string
		want int
	}{{"/json", http.StatusCreated}, {"/status", http.StatusAccepted}} {
		first, body := post(tc.path, "k"+tc.path)
		assert.Equal(t, tc.want, first.StatusCode, "%s: %s", tc.path, body)
		replay, rbody := post(tc.path, "k"+tc.path)
		require.Equal(t, "true", replay.Header.Get(idemhttp.ReplayedHeader), tc.path)
		assert.Equal(t, first.StatusCode, replay.StatusCode, tc.path)
		assert.Equal(t, body, rbody, tc.path)
		assert.Equal(t, first.Header.Get("Location"), replay.Header.Get("Location"), tc.path)
	}
	assert.Equal(t, 2, charges(), "one charge per key")
}
