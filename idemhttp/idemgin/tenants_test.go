package idemgin_test

import (
	"net/http/httptest"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemhttp"
	"github.com/seed094d4201/idem/idemhttp/idemgin"
	"github.com/seed094d4201/idem/internal/tenanttest"
)

// TestTenantIsolation runs the tenant-isolation suite on gin: one store
// behind a scoped group and an open one.
func TestTenantIsolation(t *testing.T) {
	gin.SetMode(gin.TestMode)
	tenanttest.Run(t, func(t *testing.T, cfg tenanttest.Config, runs *tenanttest.Runs) tenanttest.Client {
		store := idem.New[idemhttp.Response](idem.Options{})
		t.Cleanup(func() { store.Close() })
		serve := func(chain ...gin.HandlerFunc) string {
			r := gin.New()
			r.POST("/charges", append(chain, gin.WrapF(tenanttest.Handler(runs)))...)
			srv := httptest.NewServer(r)
			t.Cleanup(srv.Close)
			return srv.URL
		}
		auth := func(c *gin.Context) {
			if a := c.GetHeader(tenanttest.AccountHeader); a != "" {
				c.Set("account", a)
			}
		}
		return tenanttest.HTTPClient{
			Scoped: serve(auth, idemgin.Middleware(store, idemgin.Options{
				Scope: func(c *gin.Context) (string, error) { return c.GetString("account"), nil },
				HTTP:  idemhttp.Options{ScopeQuota: cfg.Quota},
			})),
			Open: serve(idemgin.Middleware(store, idemgin.Options{HTTP: idemhttp.Options{Unscoped: true, ScopeQuota: cfg.Quota}})),
		}
	})
}
