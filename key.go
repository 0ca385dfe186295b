package idem

import (
	"fmt"
	"unicode/utf8"
)

// MaxKeyLen is the longest key, in bytes, that a Store accepts.
const MaxKeyLen = 255

// CheckKey returns nil if key is a valid idempotency key: 1 to MaxKeyLen
// bytes of UTF-8 without control characters (C0, DEL or C1). Otherwise it
// returns an error that matches [ErrInvalidKey] and says what is wrong.
//
// Keys must be valid UTF-8 so that every backend, including databases with
// text columns, stores them unchanged.
func CheckKey(key string) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: empty", ErrInvalidKey)
	case len(key) > MaxKeyLen:
		return fmt.Errorf("%w: %d bytes, more than %d", ErrInvalidKey, len(key), MaxKeyLen)
	}
	for i := 0; i < len(key); {
		if c := key[i]; c < utf8.RuneSelf { // ASCII, the common case
			if c < 0x20 || c == 0x7f {
				return fmt.Errorf("%w: control character %U at byte %d", ErrInvalidKey, c, i)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(key[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			return fmt.Errorf("%w: not valid UTF-8 at byte %d", ErrInvalidKey, i)
		case r <= 0x9f:
			return fmt.Errorf("%w: control character %U at byte %d", ErrInvalidKey, r, i)
		}
		i += size
	}
	return nil
}
