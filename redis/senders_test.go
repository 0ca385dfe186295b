package redis

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The goroutines that calls whose ctx can end are sent from wait for more
// commands for senderIdle, and then end: the backend leaves none behind
// its calls for longer.
func TestSendersEndOnceIdle(t *testing.T) {
	b := testBackend(t, testClient(t))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 20 {
				_, _, err := b.Get(ctx, "k", time.Time{})
				assert.NoError(t, err)
			}
		})
	}
	wg.Wait()
	assert.Positive(t, b.senders.live.Load(), "no sender waits for the next command")
	require.Eventually(t, func() bool { return b.senders.live.Load() == 0 }, 100*senderIdle, senderIdle/10,
		"senders still running %v after the last call", 100*senderIdle)
}
