package idemgin_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemhttp"
	"github.com/seed094d4201/idem/idemhttp/idemgin"
	"github.com/seed094d4201/idem/sqlite"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// txCharges is a SQLite store and its charges table, for the
// transactional mode: charge inserts a row through the handler's
// transaction, and count counts the rows committed.
func txCharges(t *testing.T) (store *idem.Store[idemhttp.Response], charge func(ctx context.Context) (int64, error), count func() int) {
	t.Helper()
	db, err := sqlite.Open(filepath.Join(t.TempDir(), "charges.db"))
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	b, err := sqlite.New(context.Background(), db, sqlite.Options{})
	require.NoError(t, err)
	_, err = db.Exec(`CREATE TABLE charges (id INTEGER PRIMARY KEY AUTOINCREMENT)`)
	require.NoError(t, err)
	store = idem.New[idemhttp.Response](idem.Options{Backend: b})
	t.Cleanup(func() { store.Close() })
	charge = func(ctx context.Context) (int64, error) {
		tx, ok := sqlite.TxFromContext(ctx)
		if !ok {
			return 0, errors.New("no transaction in the handler's context")
		}
		var id int64
		err := tx.QueryRowContext(ctx, `INSERT INTO charges DEFAULT VALUES RETURNING id`).Scan(&id)
		return id, err
	}
	count = func() int {
		var n int
		require.NoError(t, db.QueryRow(`SELECT count(*) FROM charges`).Scan(&n))
		return n
	}
	return store, charge, count
}

// In the transactional mode a gin handler's row, its key and its response
// commit together: the client gets the handler's own status and body,
// sent after the commit, and a retry replays them. A handler that fails
// (a 5xx it writes, or gin's c.Error rendered outside the guard) has its
// row rolled back with the claim, and the retry runs it again.
func TestInTx(t *testing.T) {
	gin.SetMode(gin.TestMode)
	store, charge, count := txCharges(t)
	var runs atomic.Int32
	r := gin.New()
	r.Use(func(c *gin.Context) { // the app's error middleware
		c.Next()
		if len(c.Errors) > 0 && !c.Writer.Written() {
			c.JSON(http.StatusPaymentRequired, gin.H{"error": c.Errors.Last().Error()})
		}
	})
	guard := idemgin.Middleware(store, idemgin.Options{HTTP: idemhttp.Options{
		Unscoped: true,
		InTx:     sqlite.InTx[idemhttp.Response],
		Logger:   slog.New(slog.NewTextHandler(io.Discard, nil)),
	}})
	ok := func(c *gin.Context) {
		id, err := charge(c.Request.Context())
		if err != nil {
			c.String(http.StatusInternalServerError, err.Error())
			return
		}
		c.Header("Location", fmt.Sprintf("/charges/%d", id))
		c.JSON(http.StatusCreated, gin.H{"charge": id})
	}
	r.POST("/charges", guard, func(c *gin.Context) { runs.Add(1); ok(c) })
	r.POST("/down", guard, func(c *gin.Context) {
		if runs.Add(1) > 1 {
			ok(c)
			return
		}
		_, _ = charge(c.Request.Context())
		c.String(http.StatusBadGateway, "bank down")
	})
	r.POST("/declined", guard, func(c *gin.Context) {
		if runs.Add(1) > 1 {
			ok(c)
			return
		}
		_, _ = charge(c.Request.Context())
		_ = c.Error(errors.New("card declined"))
	})
	srv := httptest.NewServer(r)
	t.Cleanup(srv.Close)

	first, body := postKey(t, srv.URL+"/charges", "k", "{}")
	assert.Equal(t, http.StatusCreated, first.StatusCode, body)
	assert.Equal(t, `{"charge":1}`, body)
	assert.Equal(t, "/charges/1", first.Header.Get("Location"))
	retry, rbody := postKey(t, srv.URL+"/charges", "k", "{}")
	assert.Equal(t, http.StatusCreated, retry.StatusCode)
	assert.Equal(t, body, rbody)
	assert.Equal(t, "/charges/1", retry.Header.Get("Location"))
	assert.Equal(t, "true", retry.Header.Get(idemhttp.ReplayedHeader))
	assert.Equal(t, int32(1), runs.Load())
	assert.Equal(t, 1, count())

	for _, path := range []string{"/down", "/declined"} {
		t.Run(path, func(t *testing.T) {
			runs.Store(0)
			before := count()
			failed, fbody := postKey(t, srv.URL+path, "k"+path, "{}")
			if path == "/down" {
				assert.Equal(t, http.StatusBadGateway, failed.StatusCode)
				assert.Equal(t, "bank down", fbody)
			} else {
				assert.Equal(t, http.StatusPaymentRequired, failed.StatusCode, fbody)
				assert.Contains(t, fbody, "card declined")
			}
			assert.Equal(t, before, count(), "the failed handler's row was rolled back")
			again, abody := postKey(t, srv.URL+path, "k"+path, "{}")
			assert.Equal(t, http.StatusCreated, again.StatusCode, abody)
			assert.Empty(t, again.Header.Get(idemhttp.ReplayedHeader))
			assert.Equal(t, int32(2), runs.Load(), "the retry ran the handler")
			assert.Equal(t, before+1, count())
		})
	}
}
