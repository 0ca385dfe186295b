package bench

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/redis"
)

// BenchmarkRedisHandOff is what bounding a Redis call by its ctx costs: the
// redis backend's Claim and Complete of a new key called alone, under
// context.Background (ctx=background: the call runs in the caller's
// goroutine, as nothing can end it) and under a context that can be
// cancelled (ctx=cancellable: go-redis ends a command at no cancellation,
// so the backend hands each call to a sender goroutine and waits for it or
// for the ctx), against go-redis's SET NX and a Lua script that records
// the outcome (impl=raw-redis, as BenchmarkSharedNewKey's).
func BenchmarkRedisHandOff(b *testing.B) {
	for _, ctxKind := range []string{"background", "cancellable"} {
		b.Run("impl=idem-redis-backend/ctx="+ctxKind, func(b *testing.B) {
			be := redis.New(redisClient(b), redis.Options{Prefix: uniqueName("handoff:") + ":"})
			keys := makeKeys(b.N)
			forEach(b, 1, func(i int) {
				ctx, cancel := context.Background(), context.CancelFunc(func() {})
				if ctxKind == "cancellable" {
					ctx, cancel = context.WithCancel(ctx)
				}
				defer cancel()
				rec := backend.Record{Key: keys[i], Token: "0123456789abcdef0123456789abcdef", State: backend.StatePending}
				if _, ok, err := be.Claim(ctx, rec, time.Now(), 30*time.Second); err != nil || !ok {
					panic(fmt.Sprint("claim: ", ok, err))
				}
				rec.State, rec.Value = backend.StateCompleted, boltRecord
				if err := be.Complete(ctx, rec, time.Now(), time.Minute); err != nil {
					panic(err)
				}
			})
		})
	}
	b.Run("impl=raw-redis/ctx=background", func(b *testing.B) {
		do := rawRedis(b, redisClient(b))
		keys := makeKeys(b.N)
		forEach(b, 1, func(i int) { do(keys[i]) })
	})
}
