package idemecho_test

import (
	"errors"
	"io"
	"net/http"
	"testing"

	"github.com/labstack/echo/v4"
	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemhttp"
	"github.com/seed094d4201/idem/idemhttp/idemecho"
	"github.com/seed094d4201/idem/idemhttp/internal/adaptertest"
)

func TestEcho(t *testing.T) {
	adaptertest.Run(t, func(store *idem.Store[idemhttp.Response], opts idemhttp.Options, env *adaptertest.Env) http.Handler {
		e := echo.New()
		e.Use(func(next echo.HandlerFunc) echo.HandlerFunc { // the auth step
			return func(c echo.Context) error {
				c.Set("account", c.Request().Header.Get("X-Account"))
				return next(c)
			}
		})
		g := e.Group("", idemecho.Middleware(store, idemecho.Options{
			Scope: func(c echo.Context) (string, error) { s, _ := c.Get("account").(string); return s, nil },
			HTTP:  opts,
		}))
		charge := func(c echo.Context) error {
			io.ReadAll(c.Request().Body)
			n := env.Charge()
			account, _ := c.Get("account").(string)
			c.Response().Header().Set("Location", adaptertest.Location(n))
			c.SetCookie(&http.Cookie{Name: "session", Value: "secret"})
			return c.JSON(http.StatusCreated, adaptertest.ChargeJSON(n, account))
		}
		g.POST("/charges", charge)
		g.POST("/slow", func(c echo.Context) error { env.Slow(); return charge(c) })
		g.POST("/bad", func(c echo.Context) error {
			env.Fail()
			return echo.NewHTTPError(http.StatusBadRequest, "bad request")
		})
		g.POST("/down", func(c echo.Context) error {
			env.Fail()
			return echo.NewHTTPError(http.StatusBadGateway, "bank down")
		})
		g.POST("/attach", func(c echo.Context) error {
			env.Slow()
			env.Charge()
			conn, rw, err := c.Response().Hijack()
			if err != nil {
				return err
			}
			return adaptertest.Attach(conn, rw)
		})
		return e
	})
}

func TestEchoErrorPaths(t *testing.T) {
	adaptertest.RunErrorPaths(t, func(store *idem.Store[idemhttp.Response], opts idemhttp.Options, env *adaptertest.Env, m adaptertest.Mount) http.Handler {
		e := echo.New()
		e.Use(func(next echo.HandlerFunc) echo.HandlerFunc {
			return func(c echo.Context) error { c.Set("account", c.Request().Header.Get("X-Account")); return next(c) }
		})
		guard := idemecho.Middleware(store, idemecho.Options{
			Scope: func(c echo.Context) (string, error) { s, _ := c.Get("account").(string); return s, nil },
			HTTP:  opts,
		})
		// Renders a returned error as JSON of its own.
		errorWriter := func(next echo.HandlerFunc) echo.HandlerFunc {
			return func(c echo.Context) error {
				err := next(c)
				if err == nil || c.Response().Committed {
					return err
				}
				code := http.StatusInternalServerError
				var he *echo.HTTPError
				if errors.As(err, &he) {
					code = he.Code
				}
				return c.JSON(code, map[string]string{"error": err.Error()})
			}
		}
		chain := []echo.MiddlewareFunc{guard, errorWriter}
		if m.ErrorsOutside {
			chain = []echo.MiddlewareFunc{errorWriter, guard}
		}
		var routes interface {
			POST(string, echo.HandlerFunc, ...echo.MiddlewareFunc) *echo.Route
			GET(string, echo.HandlerFunc, ...echo.MiddlewareFunc) *echo.Route
		} = e
		if m.EngineWide {
			e.Use(chain...)
		} else {
			routes = e.Group("", chain...)
		}
		routes.POST("/abort-status", func(c echo.Context) error { env.Fail(); return c.NoContent(http.StatusPaymentRequired) })
		routes.POST("/abort-error", func(c echo.Context) error {
			env.Fail()
			return echo.NewHTTPError(http.StatusPaymentRequired, "card declined")
		})
		routes.POST("/error", func(c echo.Context) error { env.Fail(); return errors.New("ledger unavailable") })
		routes.GET("/only-get", func(c echo.Context) error { return c.String(http.StatusOK, "ok") })
		return e
	})
}
