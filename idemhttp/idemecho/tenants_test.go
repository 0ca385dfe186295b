package idemecho_test

import (
	"net/http/httptest"
	"testing"

	"github.com/labstack/echo/v4"
	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemhttp"
	"github.com/seed094d4201/idem/idemhttp/idemecho"
	"github.com/seed094d4201/idem/internal/tenanttest"
)

// TestTenantIsolation runs the tenant-isolation suite on echo: one store
// behind a scoped group and an open one.
func TestTenantIsolation(t *testing.T) {
	tenanttest.Run(t, func(t *testing.T, cfg tenanttest.Config, runs *tenanttest.Runs) tenanttest.Client {
		store := idem.New[idemhttp.Response](idem.Options{})
		t.Cleanup(func() { store.Close() })
		serve := func(mw ...echo.MiddlewareFunc) string {
			e := echo.New()
			e.POST("/charges", echo.WrapHandler(tenanttest.Handler(runs)), mw...)
			srv := httptest.NewServer(e)
			t.Cleanup(srv.Close)
			return srv.URL
		}
		auth := func(next echo.HandlerFunc) echo.HandlerFunc {
			return func(c echo.Context) error {
				if a := c.Request().Header.Get(tenanttest.AccountHeader); a != "" {
					c.Set("account", a)
				}
				return next(c)
			}
		}
		return tenanttest.HTTPClient{
			Scoped: serve(auth, idemecho.Middleware(store, idemecho.Options{
				Scope: func(c echo.Context) (string, error) { s, _ := c.Get("account").(string); return s, nil },
				HTTP:  idemhttp.Options{ScopeQuota: cfg.Quota},
			})),
			Open: serve(idemecho.Middleware(store, idemecho.Options{HTTP: idemhttp.Options{Unscoped: true, ScopeQuota: cfg.Quota}})),
		}
	})
}
