package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/seed094d4201/idem/backend"
)

// kind is a JSON value's kind: object, array, string, number, bool, null.
func kind(v any) string {
	switch v.(type) {
	case map[string]any:
		return "object"
	case []any:
		return "array"
	case string:
		return "string"
	case float64:
		return "number"
	case bool:
		return "bool"
	}
	return "null"
}

// mismatch says how result's shape differs from sample's, a value the
// store's Codec wrote and reads back: the kind of the whole and, for
// objects, of each field the two share. "" when nothing differs. null
// decodes as anything's zero, so it never decides; fields only one side
// has say nothing either (omitempty, a map's other keys).
func mismatch(result, sample any) string {
	rk, sk := kind(result), kind(sample)
	switch {
	case rk == "null" || sk == "null":
		return ""
	case rk != sk:
		return fmt.Sprintf("is a JSON %s, where the store's results are JSON %ss", rk, sk)
	case rk != "object":
		return ""
	}
	r, s := result.(map[string]any), sample.(map[string]any)
	for name, v := range r {
		if sv, ok := s[name]; ok {
			if why := mismatch(v, sv); why != "" {
				return fmt.Sprintf("field %q %s", name, why)
			}
		}
	}
	return ""
}

// errShape is returned by checkShape for a result that the store's
// completed records show cannot decode as what it holds.
var errShape = errors.New("-result cannot be what this store holds")

// checkShape compares the operator's result with a completed record of the
// same store that holds a JSON value: a result of another shape would fail
// to decode on every call for the whole TTL. It reports, as a note, when
// there is nothing to compare with.
func (t *tool) checkShape(ctx context.Context, result []byte) error {
	var r any
	if err := json.Unmarshal(result, &r); err != nil {
		return fmt.Errorf("%w: %w", errShape, err)
	}
	var sample backend.Record
	found, looked := false, 0
	err := t.b.Each(ctx, func(rec backend.Record) error {
		if looked++; looked > maxShapeLook {
			return errStop
		}
		var v any
		live := rec.ExpiresAt.IsZero() || rec.ExpiresAt.After(t.now) // an expired record may be another program's, from long ago
		if live && rec.State == backend.StateCompleted && !rec.Failed && len(rec.Value) > 0 && json.Unmarshal(rec.Value, &v) == nil && v != nil {
			sample, found = rec, true
			return errStop
		}
		return nil
	})
	if err != nil && !errors.Is(err, errStop) {
		return err
	}
	if !found {
		fmt.Fprintln(t.w, "note: no completed record with a JSON result to compare -result with, so its shape was not checked")
		return nil
	}
	var s any
	_ = json.Unmarshal(sample.Value, &s)
	if why := mismatch(r, s); why != "" {
		return fmt.Errorf("%w: it %s (compare: %s); every later call would fail to decode it (-force writes it all the same)", errShape, why, t.next("show", sample.Key))
	}
	if _, isHTTP := asResponse(sample.Value); isHTTP {
		// An object with none of a response's fields passes the check
		// above, and its replay could not be sent: no final status.
		if resp, ok := asResponse(result); !ok || resp.Status < 200 {
			return fmt.Errorf("%w: the store holds idemhttp responses, and it is not one: a final \"status\" (200 to 999) and no field but %s (compare: %s; -force writes it all the same)", errShape, responseFieldList(), t.next("show", sample.Key))
		}
	}
	if r, isGRPC := asReply(sample.Value); isGRPC && r.written() {
		// Likewise a gRPC reply with neither a message nor a code: every
		// replay of it would fail as Internal.
		if r, ok := asReply(result); !ok || !r.answer() {
			return fmt.Errorf("%w: the store holds idemgrpc replies, and it is not one: a \"message\" (a google.protobuf.Any in wire form, base64) or a final error's non-zero \"code\" and its \"error\", and no field but %s (compare: %s; -force writes it all the same)", errShape, fieldList(replyFields), t.next("show", sample.Key))
		}
	}
	return nil
}

// responseFieldList names responseFields, sorted.
func responseFieldList() string { return fieldList(responseFields) }

// fieldList names fields, sorted.
func fieldList(fields map[string]bool) string {
	names := make([]string, 0, len(fields))
	for name := range fields {
		names = append(names, strconv.Quote(name))
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}

// maxShapeLook bounds the records checkShape reads looking for a sample.
const maxShapeLook = 10_000

// errStop ends a listing early.
var errStop = errors.New("stop")
