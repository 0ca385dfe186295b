package idem

import (
	"bytes"
	"encoding"
	"encoding/json"
	"errors"
	"reflect"
	"unicode/utf8"
)

// errNotUTF8 refuses a payload that holds a string encoding/json cannot
// encode as it is: it writes each byte that is not UTF-8 as U+FFFD, so
// that two requests that differ only in such bytes would have one
// fingerprint, and the second would be answered with the first's outcome
// instead of ErrPayloadMismatch.
var errNotUTF8 = errors.New("idem: the payload holds a string that is not valid UTF-8, which its JSON encoding cannot tell from another (pass the bytes as a []byte or a string, or set Options.Fingerprint)")

// ufffdEscape is how encoding/json writes a byte that is not UTF-8 in a
// string; the character U+FFFD itself it writes as it is.
var ufffdEscape = []byte(`\ufffd`)

// lossyJSON reports whether enc, payload's JSON encoding, stands for a
// string of payload's that holds bytes that are not UTF-8. Only an
// encoding with the escape is looked into, so that a payload without one
// costs a scan of its encoding and nothing more; then payload is walked
// as encoding/json walks it, since the escape may also be a Marshaler's
// own, or a json.RawMessage's. The walk calls the payload's MarshalText
// methods, which may panic: its caller guards it.
func lossyJSON(payload any, enc []byte) bool {
	if !bytes.Contains(enc, ufffdEscape) {
		return false
	}
	return notUTF8(reflect.ValueOf(payload), 0)
}

var (
	jsonMarshaler = reflect.TypeFor[json.Marshaler]()
	textMarshaler = reflect.TypeFor[encoding.TextMarshaler]()
)

// maxWalk bounds the walk's depth; json.Marshal has already refused a
// cyclic value, so it is reached only by a very deep one.
const maxWalk = 1000

// notUTF8 reports whether v holds, where encoding/json would encode it as
// a string, text that is not UTF-8. A value that encodes itself (a
// json.Marshaler, whose bytes encoding/json keeps as they are) is not
// looked into; nor one whose pointer alone has the method, which
// encoding/json may or may not call: the walk errs on the side of taking
// a payload, as before.
func notUTF8(v reflect.Value, depth int) bool {
	if !v.IsValid() || depth > maxWalk {
		return false
	}
	t := v.Type()
	switch {
	case t.Implements(jsonMarshaler) || reflect.PointerTo(t).Implements(jsonMarshaler):
		return false
	case t.Implements(textMarshaler):
		if (t.Kind() == reflect.Pointer || t.Kind() == reflect.Interface) && v.IsNil() || !v.CanInterface() {
			return false // nothing to call, or a field reflect cannot hand out: taken
		}
		text, err := v.Interface().(encoding.TextMarshaler).MarshalText()
		return err == nil && !utf8.Valid(text)
	case reflect.PointerTo(t).Implements(textMarshaler):
		return false
	}
	switch v.Kind() {
	case reflect.String:
		return !utf8.ValidString(v.String())
	case reflect.Pointer, reflect.Interface:
		return !v.IsNil() && notUTF8(v.Elem(), depth+1)
	case reflect.Struct:
		for i := range t.NumField() {
			f := t.Field(i)
			if f.Tag.Get("json") == "-" || (!f.IsExported() && !f.Anonymous) {
				continue
			}
			if notUTF8(v.Field(i), depth+1) {
				return true
			}
		}
	case reflect.Map:
		for it := v.MapRange(); it.Next(); {
			k := it.Key()
			// A key of a string kind is written as it is, even one
			// with a MarshalText method; other keys go through it.
			if k.Kind() == reflect.String && !utf8.ValidString(k.String()) || k.Kind() != reflect.String && notUTF8(k, depth+1) || notUTF8(it.Value(), depth+1) {
				return true
			}
		}
	case reflect.Slice, reflect.Array:
		if t.Elem().Kind() == reflect.Uint8 { // base64, or numbers
			return false
		}
		for i := range v.Len() {
			if notUTF8(v.Index(i), depth+1) {
				return true
			}
		}
	}
	return false
}
