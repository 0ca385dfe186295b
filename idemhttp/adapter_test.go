package idemhttp_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"testing"

	"github.com/go-chi/chi/v5"
	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemhttp"
	"github.com/seed094d4201/idem/idemhttp/internal/adaptertest"
)

type accountKey struct{}

// withAccount is the app's auth step: the account goes into the context.
func withAccount(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), accountKey{}, r.Header.Get("X-Account"))))
	})
}

func accountScope(r *http.Request) (string, error) {
	account, _ := r.Context().Value(accountKey{}).(string)
	return account, nil
}

// appHandlers are the adaptertest app's handlers in plain net/http.
func appHandlers(env *adaptertest.Env) (charge, slow, bad, down, attach http.HandlerFunc) {
	charge = func(w http.ResponseWriter, r *http.Request) {
		io.ReadAll(r.Body)
		n := env.Charge()
		account, _ := accountScope(r)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", adaptertest.Location(n))
		http.SetCookie(w, &http.Cookie{Name: "session", Value: "secret"})
		w.WriteHeader(http.StatusCreated)
		json.NewEncoder(w).Encode(adaptertest.ChargeJSON(n, account))
	}
	slow = func(w http.ResponseWriter, r *http.Request) { env.Slow(); charge(w, r) }
	bad = func(w http.ResponseWriter, r *http.Request) {
		env.Fail()
		http.Error(w, "bad request", http.StatusBadRequest)
	}
	down = func(w http.ResponseWriter, r *http.Request) {
		env.Fail()
		http.Error(w, "bank down", http.StatusBadGateway)
	}
	attach = func(w http.ResponseWriter, r *http.Request) {
		env.Slow()
		env.Charge()
		conn, rw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		adaptertest.Attach(conn, rw)
	}
	return
}

func TestStandardMux(t *testing.T) {
	adaptertest.Run(t, func(store *idem.Store[idemhttp.Response], opts idemhttp.Options, env *adaptertest.Env) http.Handler {
		opts.Scope = accountScope
		guard := idemhttp.Middleware(store, opts)
		charge, slow, bad, down, attach := appHandlers(env)
		mux := http.NewServeMux()
		mux.Handle("POST /charges", guard(charge))
		mux.Handle("POST /slow", guard(slow))
		mux.Handle("POST /bad", guard(bad))
		mux.Handle("POST /down", guard(down))
		mux.Handle("POST /attach", guard(attach))
		return withAccount(mux)
	})
}

func TestChi(t *testing.T) {
	adaptertest.Run(t, func(store *idem.Store[idemhttp.Response], opts idemhttp.Options, env *adaptertest.Env) http.Handler {
		opts.Scope = accountScope
		charge, slow, bad, down, attach := appHandlers(env)
		r := chi.NewRouter()
		r.Use(withAccount)
		r.Group(func(r chi.Router) {
			r.Use(idemhttp.Middleware(store, opts))
			r.Post("/charges", charge)
			r.Post("/slow", slow)
			r.Post("/bad", bad)
			r.Post("/down", down)
			r.Post("/attach", attach)
		})
		return r
	})
}
