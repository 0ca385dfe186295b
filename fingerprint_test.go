package idem

import (
	"context"
	"crypto/sha256"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestDefaultFingerprint(t *testing.T) {
	raw := `{"order":101,"amount":450}`
	fromBytes, err := DefaultFingerprint([]byte(raw))
	require.NoError(t, err)
	fromString, err := DefaultFingerprint(raw)
	require.NoError(t, err)
	assert.Equal(t, Fingerprint(sha256.Sum256([]byte(raw))), fromBytes, "[]byte is hashed as it is")
	assert.Equal(t, fromBytes, fromString, "a string is hashed as its bytes")

	type charge struct {
		Order  int `json:"order"`
		Amount int `json:"amount"`
	}
	fromJSON, err := DefaultFingerprint(charge{101, 450})
	require.NoError(t, err)
	assert.Equal(t, fromBytes, fromJSON, "other values are hashed as their JSON encoding")

	other, err := DefaultFingerprint(charge{102, 450})
	require.NoError(t, err)
	assert.NotEqual(t, fromJSON, other)

	_, err = DefaultFingerprint(func() {})
	assert.ErrorContains(t, err, "no JSON encoding")
}

func TestDefaultFingerprintAllocatesNothingForBytesAndStrings(t *testing.T) {
	var b any = []byte(strings.Repeat("x", 100))
	var s any = strings.Repeat("y", 100)
	allocs := testing.AllocsPerRun(100, func() {
		_, _ = DefaultFingerprint(b)
		_, _ = DefaultFingerprint(s)
	})
	assert.Zero(t, allocs)
}

func TestReplayAllocatesNothing(t *testing.T) {
	s := newStore[receipt](t, Options{})
	var payload any = []byte(strings.Repeat("p", 100))
	fn := func(context.Context) (receipt, error) { return receipt{1, 450}, nil }
	ctx := context.Background()
	_, err := s.RunOnce(ctx, "16fd2706-8baf-433b-82eb-8c7fada847da", payload, fn)
	require.NoError(t, err)
	allocs := testing.AllocsPerRun(100, func() {
		_, _ = s.RunOnce(ctx, "16fd2706-8baf-433b-82eb-8c7fada847da", payload, fn)
	})
	assert.Zero(t, allocs)
}
