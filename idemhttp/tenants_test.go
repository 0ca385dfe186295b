package idemhttp_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemhttp"
	"github.com/seed094d4201/idem/internal/tenanttest"
)

// TestTenantIsolation runs the tenant-isolation suite on net/http: one
// store behind a scoped route and an open one.
func TestTenantIsolation(t *testing.T) {
	tenanttest.Run(t, func(t *testing.T, cfg tenanttest.Config, runs *tenanttest.Runs) tenanttest.Client {
		store := idem.New[idemhttp.Response](idem.Options{})
		t.Cleanup(func() { store.Close() })
		serve := func(h http.Handler) string {
			mux := http.NewServeMux()
			mux.Handle("POST /charges", h)
			srv := httptest.NewServer(mux)
			t.Cleanup(srv.Close)
			return srv.URL
		}
		scoped := idemhttp.Middleware(store, idemhttp.Options{Scope: accountScope, ScopeQuota: cfg.Quota})
		open := idemhttp.Middleware(store, idemhttp.Options{Unscoped: true, ScopeQuota: cfg.Quota})
		return tenanttest.HTTPClient{
			Scoped: serve(withAccount(scoped(tenanttest.Handler(runs)))),
			Open:   serve(open(tenanttest.Handler(runs))),
		}
	})
}
