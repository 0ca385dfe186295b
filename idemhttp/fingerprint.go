package idemhttp

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/seed094d4201/idem"
)

// RequestFingerprint identifies a request by its method, path as sent
// (escaped: /items/a%2Fb and /items/a/b are two resources, as Go's mux
// routes them), query (with its parameters sorted; one url.ParseQuery
// cannot read whole, as it was sent) and body, byte for byte. It is the
// middleware's default Options.Fingerprint.
func RequestFingerprint(r *http.Request, body []byte) (idem.Fingerprint, error) {
	h := sha256.New()
	query := ""
	if r.URL.RawQuery != "" { // an empty one encodes as "": spare parsing it into a map
		values, err := url.ParseQuery(r.URL.RawQuery)
		if err != nil {
			// ParseQuery drops the pairs it cannot read (a ';'
			// separator, a bad escape), so that two queries that differ
			// there would read alike, while a handler reading RawQuery
			// tells them apart. Marked by a byte that no encoded query
			// holds, so that it never reads as a canonical one.
			query = "\x01" + r.URL.RawQuery
		} else {
			query = values.Encode()
		}
	}
	for _, part := range []string{r.Method, r.URL.EscapedPath(), query} {
		h.Write([]byte(part))
		h.Write([]byte{0})
	}
	h.Write(body)
	var fp idem.Fingerprint
	h.Sum(fp[:0])
	return fp, nil
}

// JSONFingerprint is RequestFingerprint with the body taken as JSON and
// reduced to a canonical form, so that what does not change its meaning
// does not make two requests differ. Two bodies fingerprint alike exactly
// when encoding/json, decoding them into any with UseNumber, gives equal
// values; an object with two keys equal under case folding ("amount" and
// "AMOUNT", or one key twice) is refused, since a handler decoding into a
// struct reads it otherwise (fields match without regard to case, and a
// repeated object is merged), so no canonical form could say what it
// means:
//
//   - object members count in any order, by decoded key ("\u0061" is "a");
//   - insignificant whitespace does not count;
//   - strings compare decoded: "\u00e9" is "é" and "\/" is "/". Invalid
//     UTF-8 and unpaired surrogate escapes ("\ud800") mean U+FFFD, as
//     encoding/json reads them; a malformed escape is an error;
//   - numbers compare as written: 1, 1.0 and 1e0 are three values.
//
// The body is scanned once, with no tree built: time is linear in its
// size, and memory goes to the members of the objects still open (see the
// canonical form in jsoncanon.go), a few kilobytes for a typical body of
// any length. Nesting deeper than 10000 arrays and objects is refused, as
// encoding/json refuses it. An empty body, or one of white space only (as
// bytes.TrimSpace sees it), is taken as it is; a body that is not exactly
// one JSON value is an error that says what is wrong and where, and the
// middleware answers 400.
func JSONFingerprint(r *http.Request, body []byte) (idem.Fingerprint, error) {
	if len(bytes.TrimSpace(body)) == 0 {
		return RequestFingerprint(r, nil)
	}
	digest, err := canonicalJSON(body)
	if err != nil {
		return idem.Fingerprint{}, err
	}
	return RequestFingerprint(r, digest[:])
}

// The JSON tokens, read as RFC 8259 writes them and decoded as
// encoding/json decodes them.

// string reads the string at c.pos and returns it decoded: a slice of the
// input when it needs no decoding, else c.str.
func (c *canon) string() ([]byte, error) {
	c.pos++ // the opening quote
	start := c.pos
	for c.pos < len(c.in) {
		switch b := c.in[c.pos]; {
		case plainASCII[b]:
			c.pos++
		case b == '"':
			c.pos++
			return c.in[start : c.pos-1], nil
		case b == '\\' || b < ' ':
			return c.decodeString(start)
		default:
			r, n := utf8.DecodeRune(c.in[c.pos:])
			if r == utf8.RuneError && n == 1 {
				return c.decodeString(start)
			}
			c.pos += n
		}
	}
	return nil, c.failHere("in string")
}

// plainASCII holds the bytes a string holds as they are: ASCII, but not
// control characters, quotes or backslashes.
var plainASCII = func() (t [256]bool) {
	for b := ' '; b < utf8.RuneSelf; b++ {
		t[b] = b != '"' && b != '\\'
	}
	return t
}()

// decodeString goes on with the string begun at start, from its first byte
// that needs decoding, at c.pos.
func (c *canon) decodeString(start int) ([]byte, error) {
	s := append(c.str[:0], c.in[start:c.pos]...)
	defer func() { c.str = s[:0] }() // keeps the grown buffer
	for c.pos < len(c.in) {
		b := c.in[c.pos]
		switch {
		case b == '"':
			c.pos++
			return s, nil
		case b < ' ':
			return nil, c.failHere("in string")
		case b == '\\':
			if c.pos+1 == len(c.in) {
				c.pos++
				return nil, c.failHere("in string escape")
			}
			e := c.in[c.pos+1]
			if i := bytes.IndexByte([]byte(`"\/bfnrt`), e); i >= 0 {
				s = append(s, "\"\\/\b\f\n\r\t"[i])
				c.pos += 2
				continue
			}
			if e != 'u' {
				c.pos++
				return nil, c.failHere("in string escape")
			}
			r := c.hex4()
			if r < 0 {
				return nil, c.failHere("in \\u escape")
			}
			if utf16.IsSurrogate(r) {
				// A pair is two escapes; anything else is U+FFFD, and what
				// follows is read on its own, as encoding/json does.
				save := c.pos
				if r2 := c.hex4(); utf16.DecodeRune(r, r2) != unicode.ReplacementChar {
					r = utf16.DecodeRune(r, r2)
				} else {
					r, c.pos = unicode.ReplacementChar, save
				}
			}
			s = utf8.AppendRune(s, r)
		case b < utf8.RuneSelf:
			s = append(s, b)
			c.pos++
		default:
			r, n := utf8.DecodeRune(c.in[c.pos:]) // invalid: U+FFFD, 1 byte
			s = utf8.AppendRune(s, r)
			c.pos += n
		}
	}
	return nil, c.failHere("in string")
}

// key reads a member's key and its colon, and starts the member.
func (c *canon) key() error {
	c.skipSpace()
	if c.pos == len(c.in) || c.in[c.pos] != '"' {
		return c.failHere("in object, looking for a key")
	}
	k, err := c.string()
	if err != nil {
		return err
	}
	c.skipSpace()
	if c.pos == len(c.in) || c.in[c.pos] != ':' {
		return c.failHere("in object, looking for ':' after a key")
	}
	c.pos++
	if len(c.members) == cap(c.members) {
		c.members = slices.Grow(c.members, len(c.members)+1) // doubling, as grow
	}
	c.members = append(c.members, member{start: len(c.arena)})
	c.grow(binary.MaxVarintLen64 + len(k))
	c.arena = binary.AppendUvarint(c.arena, uint64(len(k)))
	c.arena = append(c.arena, k...)
	o := &c.objs[len(c.objs)-1]
	o.val.start, o.val.spilled = len(c.arena), false
	return nil
}

// hex4 reads the \uXXXX escape at c.pos, or returns -1 and leaves c.pos at
// the first byte that is wrong.
func (c *canon) hex4() rune {
	if !c.skip('\\') || !c.skip('u') {
		return -1
	}
	var r rune
	for range 4 {
		d := -1
		if c.pos < len(c.in) && c.in[c.pos] >= '0' { // 0x10|0x20 is '0'
			d = strings.IndexByte("0123456789abcdef", c.in[c.pos]|0x20) // A-F as a-f
		}
		if d < 0 {
			return -1
		}
		r = r<<4 | rune(d)
		c.pos++
	}
	return r
}

// number reads -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)? and writes it
// as written.
func (c *canon) number() error {
	start := c.pos
	c.skip('-')
	if !c.skip('0') && c.digits() == 0 {
		return c.failHere("in value")
	}
	if c.skip('.') && c.digits() == 0 {
		return c.failHere("in number, after its decimal point")
	}
	if c.skip('e') || c.skip('E') {
		_ = c.skip('+') || c.skip('-')
		if c.digits() == 0 {
			return c.failHere("in number, in its exponent")
		}
	}
	c.put('d', c.in[start:c.pos])
	return nil
}

// skip moves past b if it is next.
func (c *canon) skip(b byte) bool {
	if c.pos < len(c.in) && c.in[c.pos] == b {
		c.pos++
		return true
	}
	return false
}

// digits moves past [0-9]* and says how many.
func (c *canon) digits() int {
	start := c.pos
	for c.pos < len(c.in) && '0' <= c.in[c.pos] && c.in[c.pos] <= '9' {
		c.pos++
	}
	return c.pos - start
}

// literal reads word (true, false or null) and writes its first letter.
func (c *canon) literal(word string) error {
	for i := range len(word) {
		if !c.skip(word[i]) {
			return c.failHere("in literal " + word)
		}
	}
	c.tag(word[0])
	return nil
}

func (c *canon) skipSpace() {
	for c.pos < len(c.in) {
		switch c.in[c.pos] {
		case ' ', '\t', '\n', '\r':
			c.pos++
		default:
			return
		}
	}
}

// fail describes a syntax error at the current byte.
func (c *canon) fail(format string, args ...any) error {
	return fmt.Errorf("request body is not JSON: %s at byte %d", fmt.Sprintf(format, args...), c.pos)
}

// failHere is fail for the byte at c.pos, whatever it is, or its absence.
func (c *canon) failHere(where string) error {
	if c.pos == len(c.in) {
		return c.fail("unexpected end of input %s", where)
	}
	if b := c.in[c.pos]; b >= utf8.RuneSelf {
		return c.fail("invalid byte 0x%02x %s", b, where)
	}
	return c.fail("invalid character %q %s", c.in[c.pos], where)
}

// end checks that only whitespace follows the outermost value. A value
// right after a number's digits is that number gone wrong ("01"), not a
// second value.
func (c *canon) end() error {
	if c.pos == len(c.in) {
		return nil
	}
	prev := c.in[c.pos-1]
	if bytes.IndexByte([]byte(`{["-0123456789tfn`), c.in[c.pos]) >= 0 && (prev < '0' || prev > '9') {
		return fmt.Errorf("request body holds more than one JSON value (another begins at byte %d)", c.pos)
	}
	return c.failHere("after top-level value")
}
