package idemqueue

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/stretchr/testify/assert"
)

// A message with no id (one publisher's bug), or one that is not a valid
// key, cannot be handled: nothing tells its deliveries apart. Its work did
// not happen, so it is held for an operator (dead-lettered, or delivered
// again after InterruptedDelay), never acked or rejected as if it were
// done or failed for good.
func TestMessageWithoutAValidIDIsHeld(t *testing.T) {
	c := consumer(t, idemtest.NewMemoryBackend(), Options{InterruptedDelay: 7 * time.Second})
	ctx := context.Background()
	for name, key := range map[string]string{"no id": "", "too long": strings.Repeat("k", idem.MaxKeyLen+1), "control": "m\n1"} {
		d := c.Handle(ctx, key, "body", func(context.Context) (int, error) { t.Error("ran"); return 0, nil })
		assert.Equal(t, Hold, d.Action, name)
		assert.Equal(t, 7*time.Second, d.Delay, name)
		assert.ErrorIs(t, d.Err, idem.ErrInvalidKey, name)
		d = c.HandleTx(ctx, key, "body", func(context.Context, string, any) error { t.Error("called"); return nil })
		assert.Equal(t, Hold, d.Action, name)
	}
	// An adapter that finds no id, or whose key function fails, decides
	// with the empty key.
	d := c.Decide(ctx, "", fmt.Errorf("%w: the message has no id", idem.ErrInvalidKey))
	assert.Equal(t, Decision{Action: Hold, Delay: 7 * time.Second, Err: d.Err}, d)
	// A key function that panicked (a bug a fixed deploy may not have)
	// is retried: the key's absence is not what failed.
	d = c.Decide(ctx, "", &idem.PanicError{Value: "key bug"})
	assert.Equal(t, Retry, d.Action)
	// A valid key: a handler's ErrInvalidKey is its own failure.
	d = c.Decide(ctx, "m1", fmt.Errorf("downstream: %w", idem.ErrInvalidKey))
	assert.Equal(t, Retry, d.Action)
	assert.Equal(t, "hold", Hold.String())
}
