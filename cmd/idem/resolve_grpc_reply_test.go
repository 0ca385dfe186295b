package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// On a store of idemgrpc replies, resolve refuses a -result with neither a
// message nor a final error's code ('{}', a code of 0, a field no reply
// has): the shape check let any object through, and every replay of it
// failed as Internal. A final error, code and message, is taken.
func TestResolveOnAGRPCStoreWantsAReply(t *testing.T) {
	path := grpcStoreWithAnInterruptedKey(t)
	for _, bad := range []string{`{}`, `{"code":0}`, `{"error":"closed"}`, `{"code":9,"eror":"closed"}`} {
		code, _, errs := runCmd("resolve", path, "order-9", "-result", bad)
		assert.Equal(t, 1, code, bad)
		assert.Contains(t, errs, "idemgrpc replies", bad)
	}
	code, out, errs := runCmd("resolve", path, "order-9", "-result", `{"code":9,"error":"order closed"}`)
	require.Equal(t, 0, code, errs)
	assert.Contains(t, out, "resolved")
}
