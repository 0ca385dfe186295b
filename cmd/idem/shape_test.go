package main

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/bolt"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// With no completed record to compare with, resolve writes the outcome and
// says that its shape was not checked.
func TestResolveSaysWhenTheShapeCannotBeChecked(t *testing.T) {
	path := filepath.Join(t.TempDir(), "only.db")
	b, err := bolt.Open(path, nil)
	require.NoError(t, err)
	_, _, err = b.Claim(context.Background(), backend.Record{Key: "order-1", Token: "dead"}, now, 0)
	require.NoError(t, err)
	require.NoError(t, b.Close())

	code, out, errs := runCmd("resolve", path, "order-1", "-result", `"a string"`)
	require.Equal(t, 0, code, errs)
	assert.Contains(t, out, "its shape was not checked")
	assert.Contains(t, out, `resolved "order-1"`)
}

func TestMismatch(t *testing.T) {
	for _, tc := range []struct {
		result, sample any
		differs        bool
	}{
		{"s", map[string]any{"a": 1.0}, true},
		{map[string]any{"a": "x"}, map[string]any{"a": 1.0}, true},
		{map[string]any{"b": 2.0}, map[string]any{"a": 1.0}, false},
		{map[string]any{"b": true}, map[string]any{"a": 1.0}, false},                     // omitempty, or a map's other key: nothing to say
		{map[string]any{"body": "eA=="}, map[string]any{"status": 204.0}, false},         // an idemhttp.Response
		{map[string]any{"a": map[string]any{"x": "y"}}, map[string]any{"a": nil}, false}, // null says nothing
		{nil, 1.0, false},
		{[]any{1.0}, []any{"x"}, false}, // arrays: the kind of the whole only
	} {
		assert.Equal(t, tc.differs, mismatch(tc.result, tc.sample) != "", "%v against %v", tc.result, tc.sample)
	}
}

// -force writes a result the shape check refuses, for a store whose
// results take either shape (a Store[any], a json.Number).
func TestResolveForce(t *testing.T) {
	path := fixture(t)
	code, _, errs := runCmd("resolve", path, "order-103", "-result", `"a string"`)
	require.Equal(t, 1, code)
	assert.Contains(t, errs, "-force writes it all the same")
	code, out, errs := runCmd("resolve", path, "order-103", "-result", `"a string"`, "-force")
	require.Equal(t, 0, code, errs)
	assert.Contains(t, out, `resolved "order-103"`)
	code, _, _ = runCmd("show", path, "order-101", "-force")
	assert.Equal(t, 2, code, "-force goes with resolve")
}
