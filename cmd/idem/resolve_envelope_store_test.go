package main

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A store whose results are an application's own envelope, {"code": 3,
// "message": "done"} (fields that an idemgrpc reply also has, "done"
// reading as base64), is no store of idemgrpc replies: those write a
// message as a google.protobuf.Any and an error's code with its status.
// resolve takes a -result of the envelope's shape there, which decodes as
// the store's results do.
func TestResolveOnAnEnvelopeStoreIsNotJudgedAsGRPC(t *testing.T) {
	for _, sample := range []envelope{{Code: 3, Message: "done"}, {Code: 3}} {
		v, err := json.Marshal(sample)
		require.NoError(t, err)
		path := storeWithAnInterruptedKey(t, v)

		result := `{"code":0,"message":"refunded by hand"}`
		var e envelope
		require.NoError(t, json.Unmarshal([]byte(result), &e), "the store's results decode it")
		code, out, errs := runCmd("resolve", path, "order-9", "-result", result)
		assert.Equal(t, 0, code, "%s: %s", v, errs)
		assert.Contains(t, out, "resolved", string(v))
	}
}

type envelope struct {
	Code    int    `json:"code"`
	Message string `json:"message,omitempty"`
}
