package idemhttp

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/seed094d4201/idem"
)

// RequestFingerprint identifies a request by its method, path as sent
// (escaped: /items/a%2Fb and /items/a/b are two resources, as Go's mux
// routes them), query (with its parameters sorted) and body, byte for byte.
// It is the middleware's default Options.Fingerprint.
func RequestFingerprint(r *http.Request, body []byte) (idem.Fingerprint, error) {
	h := sha256.New()
	for _, part := range []string{r.Method, r.URL.EscapedPath(), r.URL.Query().Encode()} {
		h.Write([]byte(part))
		h.Write([]byte{0})
	}
	h.Write(body)
	var fp idem.Fingerprint
	h.Sum(fp[:0])
	return fp, nil
}

// JSONFingerprint is RequestFingerprint with the body taken as JSON and
// written in a canonical form first, so that key order and whitespace do not
// make two requests differ. An empty body is taken as it is; a body that is
// not JSON is an error, and the middleware answers 400.
func JSONFingerprint(r *http.Request, body []byte) (idem.Fingerprint, error) {
	if len(bytes.TrimSpace(body)) == 0 {
		return RequestFingerprint(r, nil)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber() // keep numbers as written: 1.0 and 1 stay different
	var v any
	if err := dec.Decode(&v); err != nil {
		return idem.Fingerprint{}, fmt.Errorf("request body is not JSON: %w", err)
	}
	if dec.More() {
		return idem.Fingerprint{}, fmt.Errorf("request body holds more than one JSON value")
	}
	canonical, err := json.Marshal(v) // maps marshal with sorted keys
	if err != nil {
		return idem.Fingerprint{}, err
	}
	return RequestFingerprint(r, canonical)
}
