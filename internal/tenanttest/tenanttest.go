// Package tenanttest holds the tenant-isolation tests every transport runs
// over a real listener (net/http, gin, echo, gRPC): one store behind a
// scoped route and an unscoped one, keys shaped like store keys, credentials
// in headers, trailers and metadata, and a tenant over its quota.
package tenanttest

import (
	"strings"
	"sync/atomic"
	"testing"

	"github.com/seed094d4201/idem/idemhttp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The routes of the service under test.
const (
	Scoped = "scoped" // the tenant is the caller's credential
	Open   = "open"   // no Scope: one client alone is meant to reach it
)

// Credentials are the header and trailer fields the handler sets that no
// replay may carry; Kept are those it sets that a replay must.
var (
	Credentials = []string{"set-cookie", "authorization", "authentication-info", "proxy-authentication-info"}
	Kept        = []string{"x-charge", "x-ledger"}
)

// Config is what the suite asks of the service for one test.
type Config struct {
	Quota int // new keys per tenant within a day; 0: no quota
}

// Start serves both routes over one store made for this test with cfg,
// each on a real listener of its own (a public port and an internal one)
// under the same method and path, so that only the route tells two calls
// apart, and returns a client of them. Each route's handler
// calls Runs.Next for its run number and answers it; it sets every name
// in Credentials and Kept with the run number, in its header ("x-charge",
// the credentials) and its trailer ("x-ledger", and "authorization" and
// "proxy-authentication-info" again), as its transport allows.
type Start func(t *testing.T, cfg Config, runs *Runs) Client

// Runs counts the handler's runs, shared by both routes.
type Runs struct{ n atomic.Int32 }

// Next counts a run and returns its number, from 1.
func (r *Runs) Next() int { return int(r.n.Add(1)) }

// A Client calls the service under test.
type Client interface {
	// Call sends body with key to route as tenant (no credential if
	// tenant is "").
	Call(t *testing.T, route, tenant, key, body string) Answer
}

// Outcome is what an answer says, whatever the transport spells it.
type Outcome string

// The outcomes the suite tells apart.
const (
	Done      Outcome = "done"       // the handler's answer, first or replayed
	Mismatch  Outcome = "mismatch"   // the key was used with another request (422, InvalidArgument)
	OverQuota Outcome = "over-quota" // the tenant made as many keys as it may (429, ResourceExhausted)
	Other     Outcome = "other"
)

// An Answer is one call's answer.
type Answer struct {
	Outcome  Outcome
	Detail   string // the status, for failure messages
	Replayed bool
	Run      int                 // the run number the body holds
	Header   map[string][]string // lower-case names
	Trailer  map[string][]string
}

// Run runs the suite against the service start makes.
func Run(t *testing.T, start Start) {
	t.Run("StoreShapedKeysOnTheOpenRoute", func(t *testing.T) { storeShapedKeys(t, start) })
	t.Run("AnotherTenantsKey", func(t *testing.T) { anotherTenantsKey(t, start) })
	t.Run("CredentialsNeverReplayed", func(t *testing.T) { credentialsNeverReplayed(t, start) })
	t.Run("QuotaPerTenant", func(t *testing.T) { quotaPerTenant(t, start) })
}

// done checks that a is the handler's answer, replayed or not, and returns
// its run number.
func done(t *testing.T, a Answer, replayed bool) int {
	t.Helper()
	require.Equal(t, Done, a.Outcome, a.Detail)
	require.Equal(t, replayed, a.Replayed, "replayed")
	return a.Run
}

// A key shaped like a scoped route's store key, sent to the open route with
// the same method, path and body, names a key of its own: it neither
// replays the tenant's answer nor tells the caller, with a mismatch, that
// the tenant used it.
func storeShapedKeys(t *testing.T, start Start) {
	runs := new(Runs)
	c := start(t, Config{}, runs)
	long := strings.Repeat("k", 250) // its store key is hashed: "sha256:..."
	for i, key := range []string{"k1", long, "k2"} {
		first := done(t, c.Call(t, Scoped, "acct-a", key, `{"amount":1}`), false)
		body := `{"amount":1}`
		if i == 2 {
			body = `{"amount":2}` // another request: still no mismatch
		}
		shaped := idemhttp.StoreKey("acct-a", key)
		run := done(t, c.Call(t, Open, "", shaped, body), false)
		require.NotEqual(t, first, run, "the open route replayed tenant acct-a's answer to key %q", shaped)
	}
	// And the other way: what the open route stored, no tenant reads.
	open := done(t, c.Call(t, Open, "", "k-open", `{"amount":3}`), false)
	for _, tenant := range []string{"acct-a", "0", ":"} {
		run := done(t, c.Call(t, Scoped, tenant, "k-open", `{"amount":3}`), false)
		require.NotEqual(t, open, run)
	}
}

// One tenant's key, sent by another, is a new key of the other's.
func anotherTenantsKey(t *testing.T, start Start) {
	runs := new(Runs)
	c := start(t, Config{}, runs)
	a := done(t, c.Call(t, Scoped, "acct-a", "shared", `{"amount":1}`), false)
	b := done(t, c.Call(t, Scoped, "acct-b", "shared", `{"amount":9}`), false)
	require.NotEqual(t, a, b)
	require.Equal(t, a, done(t, c.Call(t, Scoped, "acct-a", "shared", `{"amount":1}`), true))
}

// The first answer carries the handler's credentials; no replay does, in
// its header or its trailer, while the rest of both is replayed.
func credentialsNeverReplayed(t *testing.T, start Start) {
	runs := new(Runs)
	c := start(t, Config{}, runs)
	for _, route := range []string{Scoped, Open} {
		tenant := ""
		if route == Scoped {
			tenant = "acct-a"
		}
		first := c.Call(t, route, tenant, "cred-"+route, `{"amount":1}`)
		done(t, first, false)
		assert.NotEmpty(t, first.Header["set-cookie"], "the first answer has the handler's cookie")
		assert.NotEmpty(t, first.Trailer["authorization"], "the first answer has the handler's trailer")
		replay := c.Call(t, route, tenant, "cred-"+route, `{"amount":1}`)
		require.Equal(t, first.Run, done(t, replay, true))
		for _, name := range Credentials {
			assert.Empty(t, replay.Header[name], "%s: header %s replayed", route, name)
			assert.Empty(t, replay.Trailer[name], "%s: trailer %s replayed", route, name)
		}
		assert.Equal(t, first.Header["x-charge"], replay.Header["x-charge"], route)
		assert.Equal(t, first.Trailer["x-ledger"], replay.Trailer["x-ledger"], route)
	}
}

// A tenant past its quota of new keys is refused new ones, still gets its
// known keys' replays, and touches no other tenant.
func quotaPerTenant(t *testing.T, start Start) {
	runs := new(Runs)
	c := start(t, Config{Quota: 2}, runs)
	first := done(t, c.Call(t, Scoped, "acct-a", "q1", `{"amount":1}`), false)
	done(t, c.Call(t, Scoped, "acct-a", "q2", `{"amount":1}`), false)
	over := c.Call(t, Scoped, "acct-a", "q3", `{"amount":1}`)
	require.Equal(t, OverQuota, over.Outcome, over.Detail)
	before := runs.n.Load()
	require.Equal(t, first, done(t, c.Call(t, Scoped, "acct-a", "q1", `{"amount":1}`), true), "a known key still replays")
	require.Equal(t, before, runs.n.Load())
	done(t, c.Call(t, Scoped, "acct-b", "q1", `{"amount":1}`), false)
	done(t, c.Call(t, Scoped, "acct-b", "q3", `{"amount":1}`), false)
	require.Equal(t, OverQuota, c.Call(t, Scoped, "acct-a", "q4", `{"amount":1}`).Outcome, "still over")
}
