package tenanttest

import (
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/seed094d4201/idem/idemhttp"
	"github.com/stretchr/testify/require"
)

// AccountHeader carries an HTTP caller's credential: the tenant it acts for.
// The services under test authenticate it before the guard runs.
const AccountHeader = "X-Account"

// Handler is the HTTP services' handler: it reads the body, counts a run and
// answers 201 {"run": n}, with the header and trailer fields Start
// describes. Credentials reach the trailer both ways net/http offers: one
// declared in a Trailer header, one under http.TrailerPrefix.
func Handler(runs *Runs) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		n := strconv.Itoa(runs.Next())
		h := w.Header()
		h.Set("Trailer", "X-Ledger, Proxy-Authentication-Info")
		h.Set("Set-Cookie", "session="+n)
		h.Set("Authorization", "Bearer t"+n)
		h.Set("Authentication-Info", "nextnonce="+n)
		h.Set("X-Charge", "ch_"+n)
		h.Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"run":`+n+`}`)
		h.Set("X-Ledger", "posted-"+n)
		h.Set("Proxy-Authentication-Info", "rspauth="+n)
		h.Set(http.TrailerPrefix+"Authorization", "Bearer trailer-"+n)
		h.Set(http.TrailerPrefix+"Set-Cookie", "late="+n)
	}
}

// HTTPClient calls an HTTP service under test: POST /charges at the scoped
// route's base URL or the open route's.
type HTTPClient struct{ Scoped, Open string }

// Call implements Client.
func (c HTTPClient) Call(t *testing.T, route, tenant, key, body string) Answer {
	t.Helper()
	base := c.Scoped
	if route == Open {
		base = c.Open
	}
	req, err := http.NewRequest(http.MethodPost, base+"/charges", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set(idemhttp.Header, key)
	if tenant != "" {
		req.Header.Set(AccountHeader, tenant)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	a := Answer{Detail: resp.Status + " " + string(raw), Replayed: resp.Header.Get(idemhttp.ReplayedHeader) == "true",
		Header: lower(resp.Header), Trailer: lower(resp.Trailer)}
	switch resp.StatusCode {
	case http.StatusCreated:
		a.Outcome = Done
		var v struct{ Run int }
		require.NoError(t, json.Unmarshal(raw, &v), a.Detail)
		a.Run = v.Run
	case http.StatusUnprocessableEntity:
		a.Outcome = Mismatch
	case http.StatusTooManyRequests:
		a.Outcome = OverQuota
	default:
		a.Outcome = Other
	}
	return a
}

func lower(h http.Header) map[string][]string {
	m := make(map[string][]string, len(h))
	for k, v := range h {
		m[strings.ToLower(k)] = v
	}
	return m
}
