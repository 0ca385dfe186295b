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

// A call under a ctx with a deadline runs in its caller's goroutine, as
// one under a ctx that cannot end does: go-redis ends the backend's
// commands at the deadline (TestCallsEndWithCtx), so no goroutine need
// wait on them, though the client lacks ContextTimeoutEnabled (each call
// once cost a goroutine hand-off, 40-50 µs and 11 allocations a new key).
// The client's own options are left as they were.
func TestCallsUnderADeadlineRunInTheCallersGoroutine(t *testing.T) {
	rdb := testClient(t)
	h := &callerHook{caller: "TestCallsUnderADeadlineRunInTheCallersGoroutine", seen: map[string]bool{}}
	rdb.AddHook(h)
	b := testBackend(t, rdb)
	for _, tc := range []struct {
		name string
		ctx  func() (context.Context, context.CancelFunc)
	}{
		{"Deadline", func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), time.Minute)
		}},
		{"NoEnd", func() (context.Context, context.CancelFunc) { return context.Background(), func() {} }},
	} {
		ctx, cancel := tc.ctx()
		claim, won, err := b.Claim(ctx, backend.Record{Key: tc.name, Token: "t", State: backend.StatePending}, time.Now(), time.Minute)
		require.NoError(t, err)
		require.True(t, won)
		require.NoError(t, b.Renew(ctx, tc.name, "t", time.Now(), time.Minute))
		_, _, err = b.Get(ctx, tc.name, time.Now())
		require.NoError(t, err)
		require.NoError(t, b.Complete(ctx, backend.Record{Key: tc.name, Token: claim.Token, Value: []byte("v")}, time.Now(), time.Minute))
		cancel()
	}
	require.NotEmpty(t, h.seen)
	for cmd, inCaller := range h.seen {
		assert.True(t, inCaller, "%s was sent from a goroutine of its own", cmd)
	}
	assert.False(t, rdb.(*redis.Client).Options().ContextTimeoutEnabled, "New changed the client's options")
}
