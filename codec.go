package idem

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/seed094d4201/idem/backend"
)

// A Codec turns a Store's results into bytes for its Backend and back. It
// must be safe for concurrent use.
type Codec interface {
	Marshal(v any) ([]byte, error)
	Unmarshal(data []byte, v any) error
}

// JSONCodec is the Codec a Store uses unless Options.Codec says otherwise:
// encoding/json.
type JSONCodec struct{}

func (JSONCodec) Marshal(v any) ([]byte, error)      { return json.Marshal(v) }
func (JSONCodec) Unmarshal(data []byte, v any) error { return json.Unmarshal(data, v) }

// encode fills the outcome fields of a completed record (State, Value,
// Failed, ErrMsg) from fn's result and final error, with the store's Codec.
func (s *Store[R]) encode(rec *backend.Record, val R, err error) error {
	rec.State, rec.Failed, rec.ErrMsg = backend.StateCompleted, err != nil, ""
	if err != nil {
		rec.ErrMsg = err.Error()
	}
	var merr error
	rec.Value, merr = marshal(s.opts.Codec, val, "the outcome")
	return merr
}

// marshal and unmarshal call the Codec, returning a panic in it (a
// MarshalJSON that panics, say) as an error, so that it can neither leave
// a key claimed nor escape the library. An error the Codec returns is
// wrapped to name the Codec and what it could not encode (what: "the
// outcome", `step "charge"`): it reaches the Observer and the log inside a
// *NotRecordedError, or a step's caller, where a bare "json: unsupported
// type" would not say which part of the library could not go on.
func marshal(c Codec, v any, what string) (b []byte, err error) {
	returned := false
	defer guard(&returned, func(p any) { b, err = nil, fmt.Errorf("idem: the Codec panicked encoding %s: %v", what, p) }, nil)
	b, err = c.Marshal(v)
	returned = true
	if err != nil {
		return nil, fmt.Errorf("idem: the Codec could not encode %s: %w", what, err)
	}
	return b, nil
}

func unmarshal(c Codec, data []byte, v any) (err error) {
	returned := false
	defer guard(&returned, func(p any) { err = fmt.Errorf("idem: the Codec panicked decoding the outcome: %v", p) }, nil)
	err = c.Unmarshal(data, v)
	returned = true
	return err
}

// decode turns a completed record back into the outcome it recorded. A final
// error comes back with its message, and IsFinal recognises it.
func (s *Store[R]) decode(rec backend.Record) (R, error) {
	var val R
	if len(rec.Value) > 0 {
		if err := unmarshal(s.opts.Codec, rec.Value, &val); err != nil {
			return val, fmt.Errorf("idem: decoding recorded outcome: %w", err)
		}
	}
	if rec.Failed {
		return val, Final(errors.New(rec.ErrMsg))
	}
	return val, nil
}
