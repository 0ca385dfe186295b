package redis

import (
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/internal/faultproxy"
	"github.com/seed094d4201/idem/internal/faulttest"
	"github.com/seed094d4201/idem/internal/svctest"
)

// Replies lost, and connections killed, between the store and Redis: with
// go-redis retrying a command after a broken connection (its default), and
// without, so that the store's own settling is what is tested.
func TestLostReplies(t *testing.T) {
	direct := testClient(t)
	for _, tc := range []struct {
		name    string
		retries int
	}{{"ClientRetries", 0}, {"NoClientRetries", -1}} {
		t.Run(tc.name, func(t *testing.T) {
			faulttest.LostReplies(t, func(t *testing.T) faulttest.Target {
				b := testBackend(t, direct)
				proxy := faultproxy.Start(t, svctest.Redis(t))
				rdb := redis.NewClient(&redis.Options{Addr: proxy.Addr(), MaxRetries: tc.retries})
				t.Cleanup(func() { rdb.Close() })
				return faulttest.Target{
					Proxy: proxy, Backend: New(rdb, Options{Prefix: b.prefix}), Direct: b,
					// Scripts go by hash first (EVALSHA), cached or not.
					Claim:    []byte(claimScript.Hash()),
					Complete: []byte(completeScript.Hash()),
					Release:  []byte(releaseScript.Hash()),
					Done:     faultproxy.AnyReply,
				}
			})
		})
	}
}

// Stores whose clocks are a minute off either way, on one Redis and on the
// Cluster.
func TestSkewedStores(t *testing.T) {
	t.Run("Single", func(t *testing.T) {
		rdb := testClient(t)
		faulttest.SkewedStores(t, func(t *testing.T) backend.Backend { return testBackend(t, rdb) })
	})
	t.Run("Cluster", func(t *testing.T) {
		rdb := testClusterClient(t)
		faulttest.SkewedStores(t, func(t *testing.T) backend.Backend { return testClusterBackend(t, rdb) })
	})
}
