// Package keyfield reads and writes the one field that carries an
// idempotency key, in an HTTP header (idemhttp) or in gRPC metadata
// (idemgrpc): the key as it is, or as an RFC 8941 sf-string where the bare
// form would be read as something else.
package keyfield

import (
	"errors"
	"fmt"
	"strings"

	"github.com/seed094d4201/idem"
)

// Parse reads a field value: the key as it is, or as an RFC 8941 sf-string
// ("quoted", with \" and \\ escapes). Both forms of one key mean the same
// key. The key must satisfy idem.CheckKey; any other value, including an
// sf-string with parameters ("k";p=1), is an error matching
// idem.ErrInvalidKey. So is a bare key with a comma: it is what a proxy
// makes of two fields of the name when it joins them into one (RFC 9110
// section 5.3), and the field holds one key, not a list; a key with a
// comma in it is sent quoted (Encode).
func Parse(value string) (string, error) {
	if !strings.HasPrefix(value, `"`) {
		if strings.Contains(value, ",") {
			return "", fmt.Errorf("%w: a list of keys (a bare key holds no comma; quote one that does)", idem.ErrInvalidKey)
		}
		return value, idem.CheckKey(value)
	}
	key, err := unquote(value)
	if err != nil {
		return "", fmt.Errorf("%w: %w", idem.ErrInvalidKey, err)
	}
	return key, idem.CheckKey(key)
}

// unquote decodes an RFC 8941 sf-string: printable ASCII between double
// quotes, where only \" and \\ are escapes. Bytes past ASCII are taken as
// they are, as in a bare key: an idem key may hold them, and one that must
// be quoted (a comma, a leading quote or blank) is sent so by Encode;
// idem.CheckKey then checks them (UTF-8, no control characters).
func unquote(s string) (string, error) {
	if len(s) < 2 || s[len(s)-1] != '"' {
		return "", errors.New("quoted key has no closing quote")
	}
	var b strings.Builder
	for i := 1; i < len(s)-1; i++ {
		c := s[i]
		switch {
		case c == '\\':
			i++
			if i == len(s)-1 || (s[i] != '"' && s[i] != '\\') {
				return "", errors.New(`quoted key has a backslash that escapes neither " nor \`)
			}
			b.WriteByte(s[i])
		case c == '"':
			return "", errors.New("quoted key has an unescaped quote inside")
		case c < 0x20 || c == 0x7f:
			return "", fmt.Errorf("quoted key has control character %#x", c)
		default:
			b.WriteByte(c)
		}
	}
	return b.String(), nil
}

// Encode returns the field value that carries key: the key as it is, or
// as an sf-string where Parse would read it otherwise (a comma, a leading
// quote).
func Encode(key string) string {
	// Quoted too when it begins or ends with a space or a tab, which a
	// header value loses: "order-7 " must not arrive as "order-7".
	if !strings.ContainsRune(key, ',') && !strings.HasPrefix(key, `"`) && strings.Trim(key, " \t") == key {
		return key
	}
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(key) + `"`
}
