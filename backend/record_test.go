package backend

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRecordBinaryRoundTrip(t *testing.T) {
	rec := Record{
		Key:         "clé-101",
		Fingerprint: [32]byte{1, 2, 3},
		Token:       "0123456789abcdef0123456789abcdef",
		State:       StateCompleted,
		CreatedAt:   time.Unix(0, 1764493200123456789),
		ExpiresAt:   time.Unix(0, 1764579600123456789),
		Value:       []byte{0, 1, 2, 255},
		Failed:      true,
		ErrMsg:      "card declined",
	}
	b, err := rec.MarshalBinary()
	require.NoError(t, err)
	var got Record
	require.NoError(t, got.UnmarshalBinary(b))
	assert.Equal(t, rec.Key, got.Key)
	assert.Equal(t, rec.Value, got.Value)
	assert.True(t, rec.CreatedAt.Equal(got.CreatedAt))
	assert.True(t, rec.ExpiresAt.Equal(got.ExpiresAt))
	assert.Equal(t, rec.ErrMsg, got.ErrMsg)
	assert.True(t, got.Failed)

	pending := Record{Key: "k", State: StatePending, Token: "t"}
	b, err = pending.MarshalBinary()
	require.NoError(t, err)
	require.NoError(t, got.UnmarshalBinary(b))
	assert.True(t, got.ExpiresAt.IsZero(), "a zero time stays zero")
}

func TestRecordUnmarshalRejectsGarbage(t *testing.T) {
	good, err := Record{Key: "k", State: StatePending, Token: "t", Value: []byte("value")}.MarshalBinary()
	require.NoError(t, err)
	for i := range good { // every truncation is an error, never a panic
		var r Record
		assert.Error(t, r.UnmarshalBinary(good[:i]), "truncated at %d", i)
	}
	var r Record
	assert.Error(t, r.UnmarshalBinary(append(good, 0)), "trailing byte")
	assert.Error(t, r.UnmarshalBinary([]byte{9, 1}), "unknown version")
}

func FuzzRecordUnmarshal(f *testing.F) {
	good, _ := Record{Key: "k", State: StateCompleted, Token: "t", Value: []byte("v"), ErrMsg: "e"}.MarshalBinary()
	f.Add(good)
	f.Fuzz(func(t *testing.T, data []byte) {
		var r Record
		if r.UnmarshalBinary(data) == nil {
			again, err := r.MarshalBinary()
			require.NoError(t, err)
			var r2 Record
			require.NoError(t, r2.UnmarshalBinary(again))
		}
	})
}

// Steps round-trip byte for byte (version 3); a record without steps is
// written as version 2, as before steps, so older versions read it.
func TestRecordStepsRoundTrip(t *testing.T) {
	rec := Record{Key: "order-101", State: StatePending, Token: "t", Steps: []Step{
		{Name: "create-order", At: time.Unix(0, 1764493200123456789), Value: []byte(`{"id":7}`)},
		{Name: "charge", At: time.Unix(0, 1764493201000000000), Failed: true, ErrMsg: "card declined", Value: []byte{0, 255}},
		{Name: "", Value: nil},
	}}
	b, err := rec.MarshalBinary()
	require.NoError(t, err)
	assert.Equal(t, byte(3), b[0])
	var got Record
	require.NoError(t, got.UnmarshalBinary(b))
	require.Len(t, got.Steps, 3)
	for i, s := range rec.Steps {
		assert.Equal(t, s.Name, got.Steps[i].Name)
		assert.True(t, s.At.Equal(got.Steps[i].At) || s.At.IsZero() && got.Steps[i].At.IsZero())
		assert.Equal(t, s.Failed, got.Steps[i].Failed)
		assert.Equal(t, s.ErrMsg, got.Steps[i].ErrMsg)
		assert.Equal(t, len(s.Value), len(got.Steps[i].Value))
		assert.Equal(t, string(s.Value), string(got.Steps[i].Value))
	}
	for i := range b { // every truncation is an error, never a panic
		var r Record
		assert.Error(t, r.UnmarshalBinary(b[:i]), "truncated at %d", i)
	}

	rec.Steps = nil
	b, err = rec.MarshalBinary()
	require.NoError(t, err)
	assert.Equal(t, byte(2), b[0], "no steps: the layout from before steps")
}

// A refusal reads as its reason and matches both its reason and ErrRefused.
func TestRefuse(t *testing.T) {
	reason := errors.New("opened read-only")
	err := Refuse(reason)
	assert.EqualError(t, err, "opened read-only")
	assert.ErrorIs(t, err, reason)
	assert.ErrorIs(t, err, ErrRefused)
	assert.Equal(t, err, Refuse(err), "a refusal refused again is the same error")
}
