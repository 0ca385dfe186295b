package keyfield

import (
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/seed094d4201/idem"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Every key idem accepts round-trips: Parse(Encode(k)) is k. Keys with
// the characters the field treats specially (comma, quote, backslash,
// blanks at either end) next to characters past ASCII, which idem keys may
// hold: a key that must be quoted and is not ASCII was encoded into a
// value that Parse refused (sf-strings are ASCII), so WithKey sent a key
// the server answered 400 for.
func TestEveryValidKeyRoundTrips(t *testing.T) {
	keys := []string{
		"a,b", `"`, `""`, `\`, `\"`, `a"b`, " x", "x ", " ", "a, b",
		"café,1", `"ü`, " ü", "ü ", "ü", "\u00a0x", "a\u2028b", "注文,7", "😀,",
		strings.Repeat(`"`, idem.MaxKeyLen), strings.Repeat("é,", idem.MaxKeyLen/3),
	}
	alphabet := []string{"a", "Z", "0", ",", `"`, `\`, " ", ";", "=", "é", "ü", "注", "😀", "\u00a0", "~", "%"}
	r := rand.New(rand.NewPCG(1, 2))
	for range 5000 {
		var b strings.Builder
		for n := 1 + r.IntN(12); n > 0; n-- {
			b.WriteString(alphabet[r.IntN(len(alphabet))])
		}
		keys = append(keys, b.String())
	}
	for _, k := range keys {
		if idem.CheckKey(k) != nil {
			continue
		}
		v := Encode(k)
		got, err := Parse(v)
		require.NoError(t, err, "key %q sent as %q", k, v)
		require.Equal(t, k, got, "key %q sent as %q", k, v)
		assert.False(t, !strings.HasPrefix(v, `"`) && strings.Contains(v, ","), "key %q sent bare with a comma", k)
		assert.Equal(t, strings.TrimLeft(v, " \t"), v, "key %q sent as %q: a header loses the leading blank", k, v)
	}
}

// What quoting accepts beyond ASCII is still checked as a key: a quoted
// value is no way past idem.CheckKey (control characters, C1 controls,
// bytes that are not UTF-8).
func TestQuotedValuesAreCheckedAsKeys(t *testing.T) {
	for _, v := range []string{
		"\"a\x01\"", "\"a\x7f\"", "\"a\u0085\"", "\"a\xff\"", "\"a\xc3\"", `""`, `"a`, `"a"b"`, `"\a"`, `"a";p=1`,
		`"` + strings.Repeat("é", idem.MaxKeyLen/2+1) + `"`,
	} {
		_, err := Parse(v)
		assert.ErrorIs(t, err, idem.ErrInvalidKey, "%q", v)
	}
}
