package idemhttp

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/seed094d4201/idem"
	"github.com/stretchr/testify/require"
)

// jsonFP fingerprints body as a POST to /charges?b=2&a=1.
func jsonFP(t testing.TB, body string) idem.Fingerprint {
	t.Helper()
	fp, err := JSONFingerprint(httptest.NewRequest(http.MethodPost, "/charges?b=2&a=1", nil), []byte(body))
	require.NoError(t, err, "body %q", body)
	return fp
}

func TestJSONFingerprintIgnoresWhatDoesNotChangeTheValue(t *testing.T) {
	long := strings.Repeat("x", spillAt) // a member value that spills, or not, by a byte
	for _, tc := range [][2]string{
		{`{"a":1,"b":2}`, `{"b":2,"a":1}`},
		{`{"a":1,"b":2}`, " \t\r\n{ \"b\" :\n2 ,\t\"a\": 1 }\n"},
		{`[{"x":{"p":[1,{"q":true,"r":null}],"o":"s"}}]`, `[{"x":{"o":"s","p":[1,{"r":null,"q":true}]}}]`},
		{`{"\u0061":1}`, `{"a":1}`},
		{`"caf\u00e9"`, `"café"`},
		{`"caf\u00E9"`, `"café"`},
		{`"a\/b"`, `"a/b"`},
		{`"\ud83d\ude00"`, `"😀"`},
		{`"\"\\\b\f\n\r\t"`, `"\u0022\u005c\u0008\u000c\u000a\u000d\u0009"`},
		{`{"k":{"k":{"k":{"b":"\u00e9","a":[]}}}}`, `{"k":{"k":{"k":{"a":[],"b":"é"}}}}`},
		// encoding/json's meaning for what is not quite text: U+FFFD.
		{"\"\xff\"", `"\ufffd"`},
		{`"\ud800"`, `"\ufffd"`},
		{`"\ud800\u0041"`, `"\ufffdA"`},
		{`"\udc00\ud800"`, `"\ufffd\ufffd"`},
		// Long values: spilling depends on the decoded value alone.
		{`{"a":"` + long + `","b":1}`, `{"b":1,"a":"` + long[:10] + `\u0078` + long[11:] + `"}`},
		{`{"a":"` + long[1:] + `","b":1}`, `{"b":1,"a":"\u0078` + long[2:] + `"}`},
		{`{"a":[` + strings.Repeat(`{"k":"v"},`, 200) + `1]}`, `{"a":[` + strings.Repeat(`{"k":"\u0076"},`, 200) + `1]}`},
	} {
		require.Equal(t, jsonFP(t, tc[0]), jsonFP(t, tc[1]), "%s vs %s", tc[0], tc[1])
	}
}

// TestJSONFingerprintAroundTheSpillSize writes objects whose members pass
// spillAt by a few bytes, or not, in two ways that differ in length and
// order, inside arrays and objects, so that each way through the arena and
// the hashes gives the same fingerprint for the same value.
func TestJSONFingerprintAroundTheSpillSize(t *testing.T) {
	for n := spillAt - 40; n < spillAt+40; n++ {
		v := strings.Repeat("v", n)
		plain := fmt.Sprintf(`{"x":{"a":"%s","b":[1,{"c":"%s"}]},"y":[{"d":"%s","e":{}}]}`, v, v[:n/2], v)
		moved := fmt.Sprintf(`{"y":[{"e":{},"d":"\u0076%s"}],"x":{"b":[1,{"c":"%s"}],"a":"%s"}}`, v[1:], v[:n/2], v)
		require.Equal(t, jsonFP(t, plain), jsonFP(t, moved), "n=%d", n)
		require.NotEqual(t, jsonFP(t, plain), jsonFP(t, strings.Replace(plain, `"e":{}`, `"e":{"":0}`, 1)), "n=%d", n)
		wider := fmt.Sprintf(`{"x":{"a":"%sv","b":[1,{"c":"%s"}]},"y":[{"d":"%s","e":{}}]}`, v, v[:n/2], v)
		require.NotEqual(t, jsonFP(t, plain), jsonFP(t, wider), "n=%d", n)
	}
}

func TestJSONFingerprintTellsValuesApart(t *testing.T) {
	long := strings.Repeat("y", 2*spillAt)
	bodies := []string{
		`1`, `1.0`, `1e0`, `1E0`, `-0`, `0`, `"1"`, `true`, `false`, `null`, `""`, `[]`, `{}`, `[[]]`, `[{}]`, `{"":{}}`,
		`[1,2]`, `[2,1]`, `[1,[2]]`, `[[1],2]`, `[[1,2]]`, `["a","b"]`, `["ab"]`, `["a",["b"]]`,
		`{"a":1}`, `{"a":"1"}`, `{"a":[1]}`, `{"b":1}`, `{"a":1,"b":1}`, `{"a":null}`,
		`{"a":{"b":1},"c":2}`, `{"a":{"b":1,"c":2}}`, `{"a":{"b":{"c":2}}}`, `{"a":{},"b":1,"c":2}`,
		// Quotes, colons and commas inside keys and values, which a careless
		// concatenation would mix up with the structure around them.
		`{"a\":\"b":"c"}`, `{"a":"b\":\"c"}`, `{"a":"b","c":"d"}`, `{"a\",\"c":"b"}`, `{"a":"b\",\"c\":\"d"}`,
		`{"a:b":"c"}`, `{"a":"b:c"}`, `{"a,b":1}`, `["a,b"]`, `{"ab":""}`, `{"a":"b"}`, `{"":"ab"}`,
		`{"a":"` + long + `"}`, `{"a":"` + long + `y"}`, `{"a":["` + long + `"]}`, `["` + long + `"]`,
	}
	seen := make(map[idem.Fingerprint]string)
	for _, b := range bodies {
		fp := jsonFP(t, b)
		other, dup := seen[fp]
		require.False(t, dup, "%s and %s fingerprint alike", b, other)
		seen[fp] = b
	}
}

func TestJSONFingerprintKeepsTheRequestParts(t *testing.T) {
	fp := func(method, target, body string) idem.Fingerprint {
		f, err := JSONFingerprint(httptest.NewRequest(method, target, nil), []byte(body))
		require.NoError(t, err)
		return f
	}
	base := fp(http.MethodPost, "/items/a%2Fb?b=2&a=1", `{"x":1}`)
	require.Equal(t, base, fp(http.MethodPost, "/items/a%2Fb?a=1&b=2", `{"x":1}`), "the query is sorted")
	require.NotEqual(t, base, fp(http.MethodPut, "/items/a%2Fb?b=2&a=1", `{"x":1}`))
	require.NotEqual(t, base, fp(http.MethodPost, "/items/a/b?b=2&a=1", `{"x":1}`))
	require.NotEqual(t, base, fp(http.MethodPost, "/items/a%2Fb?b=3&a=1", `{"x":1}`))

	r := httptest.NewRequest(http.MethodPost, "/charges", nil)
	empty, err := RequestFingerprint(r, nil)
	require.NoError(t, err)
	for _, body := range []string{"", " ", "\r\n\t "} {
		got, err := JSONFingerprint(r, []byte(body))
		require.NoError(t, err)
		require.Equal(t, empty, got, "body %q is taken as it is", body)
	}
	require.NotEqual(t, empty, jsonFP(t, `""`))
}

func TestJSONFingerprintRefusesWhatIsNotOneJSONValue(t *testing.T) {
	for body, want := range map[string]string{
		`{"a":1} {"b":2}`: "more than one JSON value",
		`1 2`:             "more than one JSON value",
		`{} []`:           "more than one JSON value",
		`{"a":1}}`:        "not JSON: invalid character '}' after top-level value",
		`[1]]`:            "not JSON: invalid character ']' after top-level value",
		`1,`:              "not JSON: invalid character ',' after top-level value",
		`{"a":1`:          "not JSON: unexpected end of input",
		`{"a" 1}`:         "looking for ':'",
		`{a:1}`:           "looking for a key",
		`{"a":1,}`:        "looking for a key",
		`[1,]`:            "invalid character ']' in value",
		`[1 2]`:           "after array element",
		`{"a":1 "b":2}`:   "after object member",
		`01`:              "invalid character '1' after top-level value",
		`1.`:              "after its decimal point",
		`1e`:              "in its exponent",
		`-`:               "unexpected end of input in value",
		`+1`:              "invalid character '+' in value",
		`.5`:              "invalid character '.' in value",
		`tru`:             "literal true",
		`nul1`:            "literal null",
		`"abc`:            "unexpected end of input in string",
		"\"a\tb\"":        "invalid character '\\t' in string",
		`"\x"`:            "string escape",
		`"\u12g4"`:        `\u escape`,
		"\xef\xbb\xbf{}":  "invalid byte 0xef in value",
		`'a'`:             "invalid character '\\'' in value",
		// Keys a struct cannot tell apart (each pair was once
		// fingerprinted alike, yet a struct read them as other requests).
		`{"a":1,"a":2}`:                                "cannot tell apart",
		`{"a":1,"b":0,"\u0061":2}`:                     "cannot tell apart",
		`{"to":"alice","amount":1,"AMOUNT":5000}`:      "cannot tell apart",
		`{"meta":{"memo":"rent"},"meta":{"ref":"r1"}}`: "cannot tell apart",
		`{"x":[{"Kelvin":1,"\u212aelvin":2}]}`:         "cannot tell apart",
		`{"ſ":1,"S":2}`:                                "cannot tell apart",
	} {
		_, err := JSONFingerprint(httptest.NewRequest(http.MethodPost, "/", nil), []byte(body))
		require.ErrorContains(t, err, want, "body %q", body)
	}
}

func TestJSONFingerprintBoundsNesting(t *testing.T) {
	r := httptest.NewRequest(http.MethodPost, "/", nil)
	nest := func(n int, open, close string) []byte {
		return []byte(strings.Repeat(open, n) + "1" + strings.Repeat(close, n))
	}
	for _, oc := range [][2]string{{"[", "]"}, {`{"a":`, "}"}, {`[{"a":`, "}]"}} {
		depth := maxJSONDepth / (strings.Count(oc[0], "[") + strings.Count(oc[0], "{"))
		_, err := JSONFingerprint(r, nest(depth, oc[0], oc[1]))
		require.NoError(t, err, "%d levels are allowed, as encoding/json allows them", maxJSONDepth)
		_, err = JSONFingerprint(r, append([]byte("["), append(nest(depth, oc[0], oc[1]), ']')...))
		require.ErrorContains(t, err, "deeper than 10000")
	}
	_, err := JSONFingerprint(r, nest(1_000_000, "[", "]"))
	require.ErrorContains(t, err, "deeper than 10000")
}

// orders is a JSON array of realistic orders, at least size bytes long.
func orders(size int) []byte {
	b := []byte("[")
	for i := 0; len(b) < size; i++ {
		if i > 0 {
			b = append(b, ',')
		}
		b = fmt.Appendf(b, `{"id":"ord_%08d","amount":%d,"price":%d.%02d,"currency":"EUR","paid":%t,`+
			`"customer":{"name":"Zoë \"Z\" Müller","email":"zoe%d@example.com","address":{"city":"K\u00f6ln","zip":"5067%d"}},`+
			`"items":[{"sku":"sku-%d","qty":%d},{"sku":"sku-%d","qty":1}],"tags":["gift","express"],"note":null}`,
			i, i*7, i%500, i%100, i%2 == 0, i, i%10, i, i%5, i+1)
	}
	return append(b, ']')
}

// allocated says how many bytes f allocated.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

func TestJSONFingerprintMemoryIsBounded(t *testing.T) {
	r := httptest.NewRequest(http.MethodPost, "/orders", nil)
	list := orders(10 << 20)
	for name, body := range map[string][]byte{
		"array":               list,
		"array in an object":  append(append([]byte(`{"count":1,"orders":`), list...), '}'),
		"escaped and invalid": []byte("[" + strings.Repeat("[\"\\u00e9\xff\\ud800 \\\"é\"],", 1<<18) + "1]"),
	} {
		var err error
		n := allocated(func() { _, err = JSONFingerprint(r, body) })
		require.NoError(t, err, name)
		require.Less(t, n, uint64(4*len(body)), "%s: %d bytes allocated for a body of %d", name, n, len(body))
		t.Logf("%s: %d bytes allocated for a body of %d", name, n, len(body))
	}
	// One object of very many small members must hold them all to sort
	// them: the one shape whose cost grows with the body, by a small
	// constant.
	var wide bytes.Buffer
	wide.WriteByte('{')
	for i := 0; wide.Len() < 10<<20; i++ {
		fmt.Fprintf(&wide, `"m%d":%d,`, i, i)
	}
	wide.WriteString(`"end":0}`)
	var err error
	n := allocated(func() { _, err = JSONFingerprint(r, wide.Bytes()) })
	require.NoError(t, err)
	require.Less(t, n, uint64(12*wide.Len()), "one wide object: %d bytes allocated for a body of %d", n, wide.Len())
}

// decodeReference is the old reading of a body: encoding/json, into any,
// with UseNumber. ok is false when it refuses the body.
func decodeReference(body []byte) (v any, ok bool) {
	if !json.Valid(body) || foldedTwice(body) {
		return nil, false
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	return v, dec.Decode(&v) == nil
}

// reencode writes v as JSON another way than json.Marshal does: keys in
// reverse order, every non-ASCII rune and some ASCII escaped, whitespace
// between the tokens.
func reencode(b []byte, v any) []byte {
	switch v := v.(type) {
	case map[string]any:
		keys := slices.Sorted(maps.Keys(v))
		slices.Reverse(keys)
		b = append(b, " { "...)
		for i, k := range keys {
			if i > 0 {
				b = append(b, "\n,\t"...)
			}
			b = append(reencode(b, k), " : "...)
			b = reencode(b, v[k])
		}
		return append(b, "\r}"...)
	case []any:
		b = append(b, "[ "...)
		for i, e := range v {
			if i > 0 {
				b = append(b, " , "...)
			}
			b = reencode(b, e)
		}
		return append(b, " ]"...)
	case string:
		b = append(b, '"')
		for _, r := range v {
			switch {
			case r == '/':
				b = append(b, `\/`...)
			case r > ' ' && r < utf8.RuneSelf && r != '"' && r != '\\' && r != 'a':
				b = append(b, byte(r))
			case r > 0xffff:
				r -= 0x10000
				b = fmt.Appendf(b, `\u%04X\u%04x`, 0xd800+(r>>10), 0xdc00+(r&0x3ff))
			default:
				b = fmt.Appendf(b, `\u%04x`, r)
			}
		}
		return append(b, '"')
	case json.Number:
		return append(b, v...)
	default: // bool, nil
		out, _ := json.Marshal(v)
		return append(b, out...)
	}
}

// FuzzJSONFingerprint holds JSONFingerprint to encoding/json's reading of
// a body: it accepts exactly the bodies encoding/json accepts, and two of
// them fingerprint alike exactly when encoding/json decodes them to
// reflect.DeepEqual values (the last of equal keys counting in both), however
// they are written.
func FuzzJSONFingerprint(f *testing.F) {
	for _, s := range []string{
		`{"a":1,"b":[true,false,null]}`, `{"b":[true,false,null],"a":1}`, `1`, `1.0`, `"1"`, `-0.5e+10`,
		`{"a":{"b":1},"c":2}`, `{"a":{"b":1,"c":2}}`, `{"a":1,"a":2}`, `{"\u0061":2}`, `"\ud800\udc00"`,
		`"\ud800"`, "\"\xff\xfe\"", `[1,2]`, `[2,1]`, `{"a\":":":"}`, " [ ] ", `{} {}`, `[1]]`, `01`,
		`"` + strings.Repeat(`\u00e9`, 100) + `"`, `{"k":"` + strings.Repeat("v", spillAt) + `"}`,
	} {
		f.Add([]byte(s), []byte(`{"a":1,"b":[true,false,null]}`))
	}
	r := httptest.NewRequest(http.MethodPost, "/f", nil)
	f.Fuzz(func(t *testing.T, a, b []byte) {
		fpA, errA := JSONFingerprint(r, a)
		if len(bytes.TrimSpace(a)) == 0 {
			empty, _ := RequestFingerprint(r, nil)
			require.NoError(t, errA)
			require.Equal(t, empty, fpA)
			return
		}
		va, ok := decodeReference(a)
		require.Equal(t, ok, errA == nil, "encoding/json accepts %q: %v; JSONFingerprint: %v", a, ok, errA)
		if !ok {
			return
		}
		for _, other := range [][]byte{reencode(nil, va), must(json.Marshal(va))} {
			fp, err := JSONFingerprint(r, other)
			require.NoError(t, err, "%q rewritten as %q", a, other)
			require.Equal(t, fpA, fp, "%q rewritten as %q", a, other)
		}
		fpB, errB := JSONFingerprint(r, b)
		if vb, ok := decodeReference(b); ok && errB == nil {
			require.Equal(t, reflect.DeepEqual(va, vb), fpA == fpB, "%q vs %q", a, b)
		}
	})
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// foldedTwice reports whether an object in the valid JSON body has two
// keys equal under case folding, which JSONFingerprint refuses.
func foldedTwice(body []byte) bool {
	dec := json.NewDecoder(bytes.NewReader(body))
	type open struct {
		object bool
		keys   []string
		key    bool // the next string token is a key
	}
	var stack []*open
	for {
		tok, err := dec.Token()
		if err != nil {
			return false
		}
		var top *open
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		isKey := top != nil && top.object && top.key
		if top != nil && top.object {
			top.key = !top.key
		}
		switch tok := tok.(type) {
		case json.Delim:
			switch tok {
			case '{', '[':
				if isKey {
					panic("a container as a key")
				}
				stack = append(stack, &open{object: tok == '{', key: true})
			default:
				stack = stack[:len(stack)-1]
			}
		case string:
			if isKey {
				for _, k := range top.keys {
					if strings.EqualFold(k, tok) {
						return true
					}
				}
				top.keys = append(top.keys, tok)
			}
		}
	}
}
