package backend

import (
	"bytes"
	"encoding/hex"
	"errors"
	"math/rand"
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

// Records written by the version before steps (bytes made by that
// commit's MarshalBinary): still read, and a record without steps is
// written back byte for byte as it was.
func TestVersion2RecordsStillRead(t *testing.T) {
	for _, h := range []string{
		"0202096f726465722d31303101020300000000000000000000000000000000000000000000000000000000001030313233343536373839616263646566187cbd3781f36d15187d0bcc13426d158000000000000000010d63617264206465636c696e6564087b226964223a377d",
		"0201016b00000000000000000000000000000000000000000000000000000000000000000174187cbd377a97a0008000000000000000187cbd3e76bb4c00000000",
	} {
		old, err := hex.DecodeString(h)
		require.NoError(t, err)
		var r Record
		require.NoError(t, r.UnmarshalBinary(old))
		assert.Empty(t, r.Steps)
		again, err := r.MarshalBinary()
		require.NoError(t, err)
		assert.Equal(t, old, again, "byte for byte as before steps")
	}
}

// Damaged version-3 records (random byte flips, truncations, inserted
// bytes): UnmarshalBinary never panics, and whatever it accepts
// round-trips stably.
func TestDamagedRecordsNeverPanicAndRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewSource(13))
	base := Record{Key: "order-101", State: StatePending, Token: "tok", CreatedAt: time.Unix(0, 1764493200123456789),
		LeaseUntil: time.Unix(0, 1764493230000000000), Steps: []Step{
			{Name: "create-order", At: time.Unix(0, 1764493200223456789), Value: []byte(`{"id":7}`)},
			{Name: "charge", At: time.Unix(0, 1764493201000000000), Failed: true, ErrMsg: "declined", Value: []byte{0, 0xff}},
			{Name: "notify", At: time.Unix(0, 1), Value: bytes.Repeat([]byte{0x80}, 300)},
		}}
	good, err := base.MarshalBinary()
	require.NoError(t, err)
	for i := 0; i < 200000; i++ {
		b := append([]byte(nil), good...)
		switch rng.Intn(4) {
		case 0:
			for n := rng.Intn(4) + 1; n > 0; n-- {
				b[rng.Intn(len(b))] = byte(rng.Intn(256))
			}
		case 1:
			b = b[:rng.Intn(len(b))]
		case 2:
			p := rng.Intn(len(b))
			b = append(b[:p], append([]byte{byte(rng.Intn(256))}, b[p:]...)...)
		case 3:
			p := 1 + rng.Intn(len(b)-1)
			b[p] = 0xff // huge varints
			if p+1 < len(b) {
				b[p+1] = 0xff
			}
		}
		var r Record
		func() {
			defer func() {
				if p := recover(); p != nil {
					t.Fatalf("UnmarshalBinary panicked on %x: %v", b, p)
				}
			}()
			if r.UnmarshalBinary(b) != nil {
				return
			}
			again, err := r.MarshalBinary()
			require.NoError(t, err)
			var r2 Record
			require.NoError(t, r2.UnmarshalBinary(again), "%x", b)
			third, err := r2.MarshalBinary()
			require.NoError(t, err)
			require.Equal(t, again, third)
		}()
	}
}
