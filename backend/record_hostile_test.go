package backend

import (
	"bytes"
	"encoding/hex"
	"math/rand"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Records written by the version before steps (bytes made by that
// commit's MarshalBinary): still read, and a record without steps is
// written back byte for byte as it was.
func TestHostileOldVersion2RecordsStillRead(t *testing.T) {
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
func TestHostileStepsRecordMutations(t *testing.T) {
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
