package idemecho_test

import (
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
		return e
	})
}
