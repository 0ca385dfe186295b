package idemqueue

import (
	"context"
	"math"
	"sync/atomic"
	"testing"

	"github.com/seed094d4201/idem/idemtest"
	"github.com/stretchr/testify/assert"
)

// A payload the store cannot fingerprint (a NaN float, a channel, a
// MarshalJSON that fails) fails the same way on every delivery: the
// handler never runs, and the message is retried forever.
func TestReviewUnfingerprintablePayloadIsAPoisonMessage(t *testing.T) {
	c := consumer(t, idemtest.NewMemoryBackend(), Options{})
	var runs atomic.Int32
	fn := func(context.Context) (int, error) { runs.Add(1); return 1, nil }
	for i := 0; i < 3; i++ { // three redeliveries of the same message
		d := c.Handle(context.Background(), "m1", map[string]any{"amount": math.NaN()}, fn)
		t.Logf("delivery %d: %v after %v: %v", i, d.Action, d.Delay, d.Err)
		assert.Equal(t, Reject, d.Action, "a payload that can never be fingerprinted must not be retried forever")
	}
	assert.Zero(t, runs.Load())
}
