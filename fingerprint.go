package idem

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"unsafe"
)

// A Fingerprint identifies a payload: two requests under one key are the
// same request exactly when their fingerprints are equal.
type Fingerprint [sha256.Size]byte

// DefaultFingerprint is the fingerprint a Store uses unless
// Options.Fingerprint says otherwise: the SHA-256 of the payload, with a
// []byte or string hashed as it is and any other value hashed as its JSON
// encoding. A value that encoding/json cannot encode, such as a channel, is an
// error, and so is a panic in the value's MarshalJSON; so is a string in it
// that is not valid UTF-8, which the encoding would write as U+FFFD, as it
// writes any other such string (a []byte or a string payload is hashed as
// it is, whatever its bytes).
func DefaultFingerprint(payload any) (fp Fingerprint, err error) {
	switch p := payload.(type) {
	case []byte:
		return sha256.Sum256(p), nil
	case string:
		// Hash the string's bytes in place: Sum256 only reads them, and a
		// copy would cost an allocation on every replay.
		return sha256.Sum256(unsafe.Slice(unsafe.StringData(p), len(p))), nil
	}
	returned := false
	defer guard(&returned, func(v any) { fp, err = Fingerprint{}, fmt.Errorf("idem: payload's JSON encoding panicked: %v", v) }, nil)
	b, err := json.Marshal(payload)
	if err != nil {
		returned = true
		return Fingerprint{}, fmt.Errorf("idem: payload has no JSON encoding to fingerprint: %w", err)
	}
	lossy := lossyJSON(payload, b) // under the guard: it calls the payload's MarshalText
	returned = true
	if lossy {
		return Fingerprint{}, errNotUTF8
	}
	return sha256.Sum256(b), nil
}
