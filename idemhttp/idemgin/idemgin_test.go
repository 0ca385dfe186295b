package idemgin_test

import (
	"errors"
	"io"
	"net/http"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemhttp"
	"github.com/seed094d4201/idem/idemhttp/idemgin"
	"github.com/seed094d4201/idem/idemhttp/internal/adaptertest"
)

func TestGin(t *testing.T) {
	gin.SetMode(gin.TestMode)
	adaptertest.Run(t, func(store *idem.Store[idemhttp.Response], opts idemhttp.Options, env *adaptertest.Env) http.Handler {
		r := gin.New()
		r.Use(func(c *gin.Context) { c.Set("account", c.GetHeader("X-Account")) }) // the auth step
		guarded := r.Group("/", idemgin.Middleware(store, idemgin.Options{
			Scope: func(c *gin.Context) (string, error) { return c.GetString("account"), nil },
			HTTP:  opts,
		}))
		charge := func(c *gin.Context) {
			io.ReadAll(c.Request.Body)
			n := env.Charge()
			c.Header("Location", adaptertest.Location(n))
			c.SetCookie("session", "secret", 0, "/", "", false, true)
			c.JSON(http.StatusCreated, adaptertest.ChargeJSON(n, c.GetString("account")))
		}
		guarded.POST("/charges", charge)
		guarded.POST("/slow", func(c *gin.Context) { env.Slow(); charge(c) })
		guarded.POST("/bad", func(c *gin.Context) {
			env.Fail()
			c.AbortWithStatusJSON(http.StatusBadRequest, gin.H{"error": "bad request"})
		})
		guarded.POST("/down", func(c *gin.Context) {
			env.Fail()
			c.String(http.StatusBadGateway, "bank down")
		})
		guarded.POST("/attach", func(c *gin.Context) {
			env.Slow()
			env.Charge()
			conn, rw, err := c.Writer.Hijack()
			if err != nil {
				c.String(http.StatusInternalServerError, err.Error())
				return
			}
			adaptertest.Attach(conn, rw)
		})
		return r
	})
}

func TestGinErrorPaths(t *testing.T) {
	gin.SetMode(gin.TestMode)
	adaptertest.RunErrorPaths(t, func(store *idem.Store[idemhttp.Response], opts idemhttp.Options, env *adaptertest.Env, m adaptertest.Mount) http.Handler {
		r := gin.New()
		r.HandleMethodNotAllowed = true
		r.Use(func(c *gin.Context) { c.Set("account", c.GetHeader("X-Account")) })
		guard := idemgin.Middleware(store, idemgin.Options{
			Scope: func(c *gin.Context) (string, error) { return c.GetString("account"), nil },
			HTTP:  opts,
		})
		chain := []gin.HandlerFunc{guard}
		if m.ErrorsOutside {
			chain = []gin.HandlerFunc{gin.ErrorLogger(), guard}
		} else {
			chain = append(chain, gin.ErrorLogger())
		}
		routes := gin.IRoutes(r)
		if m.EngineWide {
			r.Use(chain...)
		} else {
			routes = r.Group("/", chain...)
		}
		routes.POST("/abort-status", func(c *gin.Context) { env.Fail(); c.AbortWithStatus(http.StatusPaymentRequired) })
		routes.POST("/abort-error", func(c *gin.Context) {
			env.Fail()
			_ = c.AbortWithError(http.StatusPaymentRequired, errors.New("card declined"))
		})
		routes.POST("/error", func(c *gin.Context) { env.Fail(); _ = c.Error(errors.New("ledger unavailable")) })
		routes.GET("/only-get", func(c *gin.Context) { c.String(http.StatusOK, "ok") })
		return r
	})
}
