package idemhttp_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/seed094d4201/idem/idemhttp"
	"github.com/stretchr/testify/require"
)

// payHandler decodes the body into a struct, as most Go handlers do, and
// charges what it read.
type payHandler struct{ runs atomic.Int32 }

type payment struct {
	To     string `json:"to"`
	Amount int    `json:"amount"`
	Meta   struct {
		Memo string `json:"memo"`
		Ref  string `json:"ref"`
	} `json:"meta"`
}

func (h *payHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var p payment
	if err := json.NewDecoder(r.Body).Decode(&p); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	h.runs.Add(1)
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"to":%q,"amount":%d,"memo":%q,"ref":%q}`, p.To, p.Amount, p.Meta.Memo, p.Meta.Ref)
}

// Two bodies a struct reads as two requests never share a JSONFingerprint
// (keys that differ only in case, and a repeated object that a struct
// merges, were once fingerprinted alike, and the second request got the
// first one's charge replayed). Such a body is 400:
// nothing runs and nothing is remembered.
func TestJSONFingerprintRefusesWhatAStructReadsOtherwise(t *testing.T) {
	h := &payHandler{}
	srv := serve(t, h, idemhttp.Options{Unscoped: true, Fingerprint: idemhttp.JSONFingerprint})
	for _, body := range []string{
		`{"to":"alice","amount":1,"AMOUNT":5000}`,
		`{"to":"alice","AMOUNT":5000,"amount":1}`,
		`{"to":"bob","amount":7,"meta":{"memo":"rent"},"meta":{"ref":"r1"}}`,
	} {
		resp, got := post(t, srv.Client(), srv.URL, "k", body)
		require.Equal(t, http.StatusBadRequest, resp.StatusCode, "%s: %s", body, got)
	}
	require.Zero(t, h.runs.Load())
	resp, _ := post(t, srv.Client(), srv.URL, "k", `{"to":"bob","amount":7,"meta":{"ref":"r1"}}`)
	require.Equal(t, http.StatusCreated, resp.StatusCode, "the key was never used")
}
