package postgres

import (
	"strings"
	"unicode/utf8"
)

// storable returns s as a text column can hold it: PostgreSQL refuses a NUL
// byte and bytes that are not UTF-8 in text (SQLSTATE 22021), and a final
// error's message is whatever the caller's error said. Each such byte
// becomes U+FFFD, so the outcome is recorded and replayed, its message
// marked where it could not be kept. A message that needs nothing is
// returned as it is, without allocating.
func storable(s string) string {
	if utf8.ValidString(s) && strings.IndexByte(s, 0) < 0 {
		return s
	}
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
}
