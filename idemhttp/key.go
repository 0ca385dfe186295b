package idemhttp

import (
	"crypto/rand"
	"fmt"
	"net/http"
	"strings"

	"github.com/seed094d4201/idem/internal/keyfield"
)

// Header is the request header that carries an idempotency key.
const Header = "Idempotency-Key"

// ReplayedHeader is set to "true" on a response that replays a stored one.
const ReplayedHeader = "Idempotent-Replayed"

// ParseKey reads an Idempotency-Key header value: the key as it is, or as an
// RFC 8941 sf-string ("quoted", with \" and \\ escapes). Both forms of one
// key mean the same key. The key must satisfy idem.CheckKey; any other value,
// including an sf-string with parameters ("k";p=1), is an error matching
// idem.ErrInvalidKey. So is a bare key with a comma: it is what a proxy
// makes of two Idempotency-Key fields when it joins them into one (RFC 9110
// section 5.3), and the header holds one key, not a list; a key with a
// comma in it is sent quoted.
func ParseKey(value string) (string, error) { return keyfield.Parse(value) }

// NewKey returns a new random key: a version 4 UUID, 122 random bits. Make
// it where the intent is made (when the order is placed), store it with the
// order, and send it on every attempt, including after a restart.
func NewKey() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported platforms
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}

// WithKey returns a shallow copy of req that carries key in its
// Idempotency-Key header, in place of any it had; req itself is not
// changed. Transport then sends that key on every attempt, and across
// redirects, instead of making its own.
func WithKey(req *http.Request, key string) *http.Request {
	r := req.Clone(req.Context())
	setKey(r.Header, encodeKey(key))
	return r
}

// encodeKey returns the header value that carries key: the key as it is,
// or as an sf-string where ParseKey would read it otherwise (a comma, a
// leading quote, a leading or trailing blank).
func encodeKey(key string) string { return keyfield.Encode(key) }

// keyOf returns the Idempotency-Key in h, however its name was spelt by
// whoever set it (h["idempotency-key"] bypasses canonicalisation).
func keyOf(h http.Header) string {
	if v := h.Get(Header); v != "" {
		return v
	}
	for name, v := range h {
		if len(v) > 0 && strings.EqualFold(name, Header) {
			return v[0]
		}
	}
	return ""
}

// setKey makes value h's one Idempotency-Key, removing any other spelling of
// the name, so that a request never carries two.
func setKey(h http.Header, value string) {
	for name := range h {
		if strings.EqualFold(name, Header) {
			delete(h, name)
		}
	}
	h.Set(Header, value)
}
