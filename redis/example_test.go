package redis_test

import (
	"context"
	"log"
	"os"

	goredis "github.com/redis/go-redis/v9"
	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/redis"
)

// A store shared by every replica through Redis (a single server,
// Sentinel or a Cluster: any go-redis UniversalClient). (Not run as a
// test: it needs a server, IDEM_REDIS_ADDR.)
func Example() {
	rdb := goredis.NewUniversalClient(&goredis.UniversalOptions{Addrs: []string{os.Getenv("IDEM_REDIS_ADDR")}})
	defer rdb.Close()
	store := idem.New[int](idem.Options{Backend: redis.New(rdb, redis.Options{Prefix: "payments:"})})
	defer store.Close()

	charge, err := store.RunOnce(context.Background(), "order-101", "450", func(ctx context.Context) (int, error) {
		return 1, nil // the side effect, once across every replica
	})
	log.Println(charge, err)
}
