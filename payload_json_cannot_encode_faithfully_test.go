package idem

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// textOf is a TextMarshaler whose text is its own bytes.
type textOf string

func (t textOf) MarshalText() ([]byte, error) { return []byte(t), nil }

// promoted is embedded unexported: encoding/json promotes its fields.
type promoted struct{ T textOf }

// rawJSON is a Marshaler that writes a JSON string with an invalid byte,
// which encoding/json passes through as it is.
type rawJSON struct{}

func (rawJSON) MarshalJSON() ([]byte, error) { return []byte("\"\xff\""), nil }

// Two requests whose JSON encodings differ only where a string holds bytes
// that are not UTF-8 encode alike (encoding/json writes each such byte as
// U+FFFD): the second must not be answered with the first's outcome.
func TestPayloadsThatDifferOnlyInBytesThatAreNotUTF8AreNotOneRequest(t *testing.T) {
	type charge struct {
		Card string
	}
	s := newStore[string](t, Options{})
	ctx := context.Background()
	var ran []string
	run := func(p any, name string) (string, error) {
		return s.RunOnce(ctx, "order-1", p, func(context.Context) (string, error) {
			ran = append(ran, name)
			return "charged " + name, nil
		})
	}
	got1, err1 := run(charge{Card: "\xff"}, "ff")
	got2, err2 := run(charge{Card: "\xfe"}, "fe")
	if err1 == nil && err2 == nil {
		t.Fatalf("second request answered %q with the first's outcome %q (ran %v)", got2, got1, ran)
	}
	for _, err := range []error{err1, err2} {
		if err != nil && !errors.Is(err, ErrInvalidPayload) && !errors.Is(err, ErrPayloadMismatch) {
			t.Fatalf("unexpected error %v", err)
		}
	}
}

func TestDefaultFingerprintRefusesWhatJSONWouldEncodeAsUFFFD(t *testing.T) {
	type inner struct{ V string }
	type outer struct {
		Ptr   *inner
		Items []any
	}
	for name, p := range map[string]any{
		"field":          struct{ A string }{"a\xffb"},
		"map key":        map[string]int{"\xff": 1},
		"map value":      map[string]string{"k": "\xc3"},
		"nested":         outer{Ptr: &inner{"\xed\xa0\x80"}},
		"in interface":   outer{Items: []any{1, "ok", "\xff"}},
		"text marshaler": map[textOf]int{"\xff": 1},
		"text value":     []textOf{"\xfe"},
		"as string tag": struct {
			N string `json:",string"`
		}{"\xff"},
	} {
		_, err := DefaultFingerprint(p)
		assert.ErrorIs(t, err, errNotUTF8, name)
	}
}

func TestDefaultFingerprintTakesTextThatMerelyLooksLikeUFFFD(t *testing.T) {
	for name, p := range map[string]any{
		"the character":                 struct{ A string }{"\ufffd"},
		"an escaped backslash":          struct{ A string }{`\ufffd`},
		"a raw message with the escape": json.RawMessage(`{"a":"\ufffd"}`),
		"a marshaler's own bytes":       struct{ R rawJSON }{},
		"an ignored field": struct {
			A string `json:"-"`
		}{"\xff"},
		"an unexported field": struct{ a, B string }{"\xff", "\ufffd"},
		"bytes, base64":       struct{ B []byte }{[]byte("\xff\ufffd")},
		"promoted from an unexported embedded struct": struct {
			promoted
			R json.RawMessage
		}{promoted{T: "ok"}, json.RawMessage(`"\ufffd"`)},
	} {
		_, err := DefaultFingerprint(p)
		require.NoError(t, err, name)
	}
}
