package idemecho_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/labstack/echo/v4"
	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemhttp"
	"github.com/seed094d4201/idem/idemhttp/idemecho"
)

// An echo route guarded by idempotency keys: an error the handler returns
// is answered, remembered and replayed as echo writes it.
func ExampleMiddleware() {
	store := idem.New[idemhttp.Response](idem.Options{})
	defer store.Close()
	e := echo.New()
	g := e.Group("", idemecho.Middleware(store, idemecho.Options{}))
	g.POST("/charges", func(c echo.Context) error {
		return echo.NewHTTPError(http.StatusPaymentRequired, "card declined")
	})

	for range 2 {
		req := httptest.NewRequest(http.MethodPost, "/charges", strings.NewReader(`{"order":101}`))
		req.Header.Set(idemhttp.Header, "order-101-key")
		w := httptest.NewRecorder()
		e.ServeHTTP(w, req)
		fmt.Println(w.Code, strings.TrimSpace(w.Body.String()), "replayed:", w.Header().Get(idemhttp.ReplayedHeader) == "true")
	}
	// Output:
	// 402 {"message":"card declined"} replayed: false
	// 402 {"message":"card declined"} replayed: true
}
