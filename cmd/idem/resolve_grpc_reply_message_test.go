package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// On a store of idemgrpc replies, resolve refuses a -result whose
// "message" is no google.protobuf.Any in wire form ("hello" in base64, or
// an Any with no type URL): every replay of it would fail to decode, as
// Internal, for the whole TTL. An Any that names its type is taken.
func TestResolveOnAGRPCStoreWantsTheMessageAsAnAny(t *testing.T) {
	for _, bad := range []string{`{"message":"aGVsbG8="}`, `{"message":"CgA="}`} {
		path := grpcStoreWithAnInterruptedKey(t)
		code, _, errs := runCmd("resolve", path, "order-9", "-result", bad)
		assert.Equal(t, 1, code, bad)
		assert.Contains(t, errs, "idemgrpc replies", bad)
	}
	good := `{"message":"Cip0eXBlLmdvb2dsZWFwaXMuY29tL2dvb2dsZS5wcm90b2J1Zi5TdHJ1Y3Q="}` // an empty google.protobuf.Struct
	path := grpcStoreWithAnInterruptedKey(t)
	code, out, errs := runCmd("resolve", path, "order-9", "-result", good)
	assert.Equal(t, 0, code, errs)
	assert.Contains(t, out, "resolved")
}
