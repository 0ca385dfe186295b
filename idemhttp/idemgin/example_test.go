package idemgin_test

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/gin-gonic/gin"
	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemhttp"
	"github.com/seed094d4201/idem/idemhttp/idemgin"
)

// A gin route guarded by idempotency keys: the retry replays the stored
// response, Content-Type included, and the handler runs once.
func ExampleMiddleware() {
	gin.SetMode(gin.ReleaseMode)
	store := idem.New[idemhttp.Response](idem.Options{})
	defer store.Close()
	charges := 0
	r := gin.New()
	r.Use(func(c *gin.Context) { c.Set("account", c.GetHeader("X-Account")) }) // your auth
	r.POST("/charges", idemgin.Middleware(store, idemgin.Options{
		Scope: func(c *gin.Context) (string, error) {
			if account := c.GetString("account"); account != "" {
				return account, nil
			}
			return "", errors.New("no account: did the auth middleware run?") // 500; nothing runs
		},
		HTTP: idemhttp.Options{Required: true},
	}), func(c *gin.Context) {
		charges++
		c.JSON(http.StatusCreated, gin.H{"charge": charges})
	})

	for range 2 {
		req := httptest.NewRequest(http.MethodPost, "/charges", strings.NewReader(`{"order":101}`))
		req.Header.Set(idemhttp.Header, "order-101-key")
		req.Header.Set("X-Account", "shop-7")
		w := httptest.NewRecorder()
		r.ServeHTTP(w, req)
		fmt.Println(w.Code, w.Header().Get("Content-Type"), strings.TrimSpace(w.Body.String()), "replayed:", w.Header().Get(idemhttp.ReplayedHeader) == "true")
	}
	// Output:
	// 201 application/json; charset=utf-8 {"charge":1} replayed: false
	// 201 application/json; charset=utf-8 {"charge":1} replayed: true
}
