package backend

import (
	"strings"
	"unicode/utf8"
)

// StorableText returns s with each NUL byte, and each run of bytes that
// are not UTF-8, replaced by U+FFFD: what a backend whose text columns
// cannot hold them (PostgreSQL refuses both in text, SQLSTATE 22021)
// stores for a final error's message, Record.ErrMsg, whatever the
// caller's error said. The outcome is then recorded and replayed, its
// message marked where it could not be kept, and a Store that reads the
// record back takes it for the message it wrote. A string that needs
// nothing is returned as it is, without allocating.
func StorableText(s string) string {
	if utf8.ValidString(s) && strings.IndexByte(s, 0) < 0 {
		return s
	}
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
}
