package redis

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
)

// A client told to set no socket deadlines at all (ReadTimeout and
// WriteTimeout -2) ignores ctx's deadline too, ContextTimeoutEnabled or
// not: go-redis then never bounds a read. Against a Redis that never
// answers, every call still returns once its ctx's deadline passes, with
// ctx's error, rather than hanging until the server answers.
func TestCallsEndAtTheDeadlineOnAClientWithoutSocketDeadlines(t *testing.T) {
	const wait = 300 * time.Millisecond
	for _, tc := range []struct {
		name   string
		client redis.Options
	}{
		{"NoDeadlines", redis.Options{ReadTimeout: -2, WriteTimeout: -2}},
		{"NoDeadlines/ContextTimeoutEnabled", redis.Options{ReadTimeout: -2, WriteTimeout: -2, ContextTimeoutEnabled: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			opts := tc.client
			opts.Addr = silentServer(t)
			rdb := redis.NewClient(&opts)
			t.Cleanup(func() { rdb.Close() })
			newCtx := func() (context.Context, context.CancelFunc) { return context.WithTimeout(context.Background(), wait) }
			done := make(chan map[string]outcome, 1)
			go func() { done <- callAll(New(rdb, Options{}), newCtx) }()
			select {
			case out := <-done:
				for name, o := range out {
					assert.ErrorIs(t, o.err, context.DeadlineExceeded, name)
					assert.Less(t, o.took, wait+slack, "%s outlived its ctx by %v", name, o.took-wait)
				}
			case <-time.After(wait + 10*time.Second):
				// The silent server's cleanup closes the connections, which
				// ends the calls still waiting.
				t.Fatal("calls under a deadline were still waiting 10 s after it")
			}
		})
	}
}
