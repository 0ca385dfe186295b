package redis

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/seed094d4201/idem/internal/svctest"
	"github.com/stretchr/testify/require"
)

// testClient connects to the Redis svctest.Redis finds, or skips the test
// when there is none (fails it, in CI).
func testClient(t testing.TB) redis.UniversalClient {
	t.Helper()
	addr := svctest.Redis(t)
	rdb := redis.NewUniversalClient(&redis.UniversalOptions{Addrs: []string{addr}})
	require.NoError(t, rdb.Ping(context.Background()).Err())
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// testBackend returns a Backend under a prefix of its own, whose keys are
// deleted when the test ends.
func testBackend(t testing.TB, rdb redis.UniversalClient) *Backend {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	prefix := "idemtest:" + hex.EncodeToString(b[:]) + ":"
	t.Cleanup(func() {
		ctx := context.Background()
		iter := rdb.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			rdb.Del(ctx, iter.Val())
		}
	})
	return New(rdb, Options{Prefix: prefix})
}

func TestConformance(t *testing.T) {
	rdb := testClient(t)
	idemtest.RunShared(t, func(t *testing.T) backend.Backend {
		flushScripts(t, rdb) // every subtest starts on a server that knows no script
		return testBackend(t, rdb)
	})
}

// TestContract runs the store-level contract through RunOnce and Begin under
// a prefix of its own; leases and expiry go by the server's TIME.
func TestContract(t *testing.T) {
	svctest.AtOnceUnlessLong(t) // beside the package's other suite: both mostly wait on leases
	rdb := testClient(t)
	idemtest.RunContract(t, idemtest.Harness{
		Backend: func(t *testing.T) backend.Backend {
			return testBackend(t, rdb)
		},
		ServerClock: true,
	})
}

// TestModel drives two stores under one prefix with idemtest's random
// model, on the server's TIME.
func TestModel(t *testing.T) {
	t.Parallel() // beside the other model run, a minute of wall time instead of two
	rdb := testClient(t)
	idemtest.RunModel(t, idemtest.Harness{
		Backend:     func(t *testing.T) backend.Backend { return testBackend(t, rdb) },
		ServerClock: true,
	})
}
