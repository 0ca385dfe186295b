package main

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/bolt"
	"github.com/seed094d4201/idem/idemhttp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// On a store of idemhttp responses, resolve refuses a -result that is not
// one with a final status ('{}', a status of 0, 42 or 103, a field no
// response has): the shape check let an object with none of the
// response's fields through, and its replay could not be sent. -force
// writes it all the same.
func TestResolveOnAnHTTPStoreWantsAResponse(t *testing.T) {
	path := httpStore(t, idemhttp.Options{Unscoped: true}, func(r *http.Request) {})
	b, err := bolt.Open(path, nil)
	require.NoError(t, err)
	key := idemhttp.StoreKey("", "order-8")
	_, claimed, err := b.Claim(context.Background(), backend.Record{Key: key, Token: "dead-owner", State: backend.StatePending},
		time.Now().Add(-time.Hour), time.Millisecond)
	require.NoError(t, err)
	require.True(t, claimed)
	require.NoError(t, b.Close())

	for _, bad := range []string{`{}`, `{"status":0}`, `{"status":42}`, `{"status":103}`, `{"status":201,"bdy":"x"}`} {
		code, _, errs := runCmd("resolve", path, "order-8", "-scope", "", "-result", bad)
		assert.Equal(t, 1, code, bad)
		assert.Contains(t, errs, "cannot be what this store holds", bad)
	}
	code, out, errs := runCmd("resolve", path, "order-8", "-scope", "", "-result", `{"status":201,"header":{"Location":["/orders/8"]}}`)
	require.Equal(t, 0, code, errs)
	assert.Contains(t, out, "resolved")
}
