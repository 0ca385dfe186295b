package redis

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/seed094d4201/idem/backend"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// callerHook records, for every script command, whether it was sent from
// a goroutine whose stack holds the function named caller.
type callerHook struct {
	caller string
	mu     sync.Mutex
	seen   map[string]bool // a script's hash: whether every send of it was from caller
}

func (h *callerHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *callerHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *callerHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if name := cmd.Name(); name == "eval" || name == "evalsha" {
			buf := make([]byte, 64<<10)
			inCaller := strings.Contains(string(buf[:runtime.Stack(buf, false)]), h.caller)
			script := fmt.Sprint(cmd.Args()[1])
			h.mu.Lock()
			if seen, ok := h.seen[script]; !ok || seen {
				h.seen[script] = inCaller
			}
			h.mu.Unlock()
		}
		return next(ctx, cmd)
	}
}

// A call under a ctx that can never end runs in its caller's goroutine,
// with no hand-off (a hand-off costs 40-50 µs and 11 allocations a new
// key); one whose ctx can end is waited on from a goroutine of its own
// (TestCallsEndWithCtx). The client's own options are left as they were.
func TestCallsThatCannotEndRunInTheCallersGoroutine(t *testing.T) {
	rdb := testClient(t)
	h := &callerHook{caller: "TestCallsThatCannotEndRunInTheCallersGoroutine", seen: map[string]bool{}}
	rdb.AddHook(h)
	b := testBackend(t, rdb)
	ctx := context.Background()
	claim, won, err := b.Claim(ctx, backend.Record{Key: "k", Token: "t", State: backend.StatePending}, time.Now(), time.Minute)
	require.NoError(t, err)
	require.True(t, won)
	require.NoError(t, b.Renew(ctx, "k", "t", time.Now(), time.Minute))
	_, _, err = b.Get(ctx, "k", time.Now())
	require.NoError(t, err)
	require.NoError(t, b.Complete(ctx, backend.Record{Key: "k", Token: claim.Token, Value: []byte("v")}, time.Now(), time.Minute))
	require.NotEmpty(t, h.seen)
	for cmd, inCaller := range h.seen {
		assert.True(t, inCaller, "%s was sent from a goroutine of its own", cmd)
	}
	assert.False(t, rdb.(*redis.Client).Options().ContextTimeoutEnabled, "New changed the client's options")
}
