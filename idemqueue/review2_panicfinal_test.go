package idemqueue

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A handler that panics with an error marked Final (panic(idem.Final(err)))
// failed before commit: the core releases the key and records nothing, so
// the message must be retried, not rejected (dead-lettered) as if its
// failure were the recorded, definitive outcome. Decide must agree with
// the store about what a panic is.
func TestReview2PanicWithAFinalErrorIsRetried(t *testing.T) {
	c := consumer(t, idemtest.NewMemoryBackend(), Options{})
	ctx := context.Background()
	declined := idem.Final(errors.New("card declined"))
	var runs atomic.Int32
	d := c.Handle(ctx, "m1", "body", func(context.Context) (int, error) { runs.Add(1); panic(declined) })
	var panicked *idem.PanicError
	require.ErrorAs(t, d.Err, &panicked)
	assert.Equal(t, Retry, d.Action, "a panic released the key: nothing was recorded")
	assert.False(t, d.Replayed)

	// The store agrees: the key was released, and the next delivery runs.
	d = c.Handle(ctx, "m1", "body", func(context.Context) (int, error) { runs.Add(1); return 1, nil })
	assert.Equal(t, Decision{Action: Ack}, d)
	assert.Equal(t, int32(2), runs.Load())

	// Decide alone, with the error a handler's panic becomes.
	d = c.Decide(ctx, "m2", &idem.PanicError{Value: declined})
	assert.Equal(t, Retry, d.Action)
}
