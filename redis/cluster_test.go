package redis

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/seed094d4201/idem/internal/svctest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// testClusterClient connects to the Redis Cluster IDEM_REDIS_CLUSTER_ADDRS
// names (its nodes' host:port, comma-separated), or skips the test when it
// is not set (fails it, in CI). The client is a *redis.ClusterClient, as
// redis.NewUniversalClient makes for a Cluster.
func testClusterClient(t testing.TB) redis.UniversalClient {
	t.Helper()
	rdb := redis.NewUniversalClient(&redis.UniversalOptions{Addrs: svctest.RedisCluster(t), IsClusterMode: true})
	t.Cleanup(func() { rdb.Close() })
	require.IsType(t, (*redis.ClusterClient)(nil), rdb)
	require.NoError(t, rdb.Ping(context.Background()).Err())
	return rdb
}

// testClusterBackend is testBackend for a Cluster: a Backend under a prefix
// of its own, whose keys are deleted from every primary when the test ends.
func testClusterBackend(t testing.TB, rdb redis.UniversalClient) *Backend {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	prefix := "idemtest:" + hex.EncodeToString(b[:]) + ":"
	t.Cleanup(func() {
		_ = forEachPrimary(context.Background(), rdb, func(ctx context.Context, node *redis.Client) error {
			iter := node.Scan(ctx, 0, prefix+"*", 1000).Iterator()
			for iter.Next(ctx) {
				node.Del(ctx, iter.Val())
			}
			return iter.Err()
		})
	})
	return New(rdb, Options{Prefix: prefix})
}

// forEachPrimary calls fn with every primary that rdb writes to: each master
// of a Cluster (concurrently), or the one server.
func forEachPrimary(ctx context.Context, rdb redis.UniversalClient, fn func(context.Context, *redis.Client) error) error {
	switch c := rdb.(type) {
	case *redis.ClusterClient:
		return c.ForEachMaster(ctx, fn)
	case *redis.Client:
		return fn(ctx, c)
	}
	return fmt.Errorf("no primaries known for a %T", rdb)
}

// keysUnder returns the keys under prefix on each primary, by its address.
func keysUnder(t *testing.T, rdb redis.UniversalClient, prefix string) map[string][]string {
	t.Helper()
	var mu sync.Mutex
	keys := make(map[string][]string)
	require.NoError(t, forEachPrimary(context.Background(), rdb, func(ctx context.Context, node *redis.Client) error {
		var found []string
		iter := node.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			found = append(found, iter.Val())
		}
		mu.Lock()
		defer mu.Unlock()
		keys[node.Options().Addr] = found
		return iter.Err()
	}))
	return keys
}

// flushScripts empties the script cache of every primary, as a restart or a
// failover to a fresh replica would.
func flushScripts(t *testing.T, rdb redis.UniversalClient) {
	t.Helper()
	require.NoError(t, forEachPrimary(context.Background(), rdb, func(ctx context.Context, node *redis.Client) error {
		return node.ScriptFlush(ctx).Err()
	}))
}

// waitGone waits until b holds none of keys' records: Redis expired them.
// It polls, up to a bound.
func waitGone(t *testing.T, b *Backend, keys []string) {
	t.Helper()
	want := make(map[string]bool, len(keys))
	for _, k := range keys {
		want[k] = true
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		left := 0
		require.NoError(t, b.Each(context.Background(), func(rec backend.Record) error {
			if want[rec.Key] {
				left++
			}
			return nil
		}))
		if left == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d records still there 10s after their TTL", left, len(keys))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestClusterConformance(t *testing.T) {
	rdb := testClusterClient(t)
	idemtest.RunShared(t, func(t *testing.T) backend.Backend {
		flushScripts(t, rdb) // every subtest starts on nodes that know no script
		return testClusterBackend(t, rdb)
	})
}

// TestClusterColdScriptCache: a Store over a Cluster whose primaries have
// forgotten every script runs, replays, forgets and sweeps keys in every
// slot range without error.
func TestClusterColdScriptCache(t *testing.T) {
	rdb := testClusterClient(t)
	testColdScriptCache(t, rdb, testClusterBackend(t, rdb))
}

// TestSingleColdScriptCache: the same on a single Redis.
func TestSingleColdScriptCache(t *testing.T) {
	rdb := testClient(t)
	testColdScriptCache(t, rdb, testBackend(t, rdb))
}

// testColdScriptCache empties the script cache before each step, so that
// every script the step runs is unknown to the server when it is first sent.
func testColdScriptCache(t *testing.T, rdb redis.UniversalClient, b *Backend) {
	ctx := context.Background()
	s := idem.New[int](idem.Options{Backend: b, TTL: time.Minute, SweepInterval: -1})
	defer s.Close()
	const n = 300
	var runs atomic.Int32
	key := func(i int) string { return fmt.Sprintf("key-%03d", i) }
	runAll := func(step string) {
		t.Helper()
		for i := range n {
			v, err := s.RunOnce(ctx, key(i), i, func(context.Context) (int, error) { runs.Add(1); return i, nil })
			require.NoError(t, err, "%s: %s", step, key(i))
			require.Equal(t, i, v, "%s: %s", step, key(i))
		}
	}

	flushScripts(t, rdb)
	runAll("first run")
	require.EqualValues(t, n, runs.Load())
	if _, ok := rdb.(*redis.ClusterClient); ok {
		perNode := keysUnder(t, rdb, b.prefix)
		require.Greater(t, len(perNode), 1, "a Cluster of one primary proves nothing")
		for addr, keys := range perNode {
			assert.Greater(t, len(keys), n/10, "%s holds only %d of the %d keys", addr, len(keys), n)
		}
	}

	flushScripts(t, rdb)
	runAll("replay")
	require.EqualValues(t, n, runs.Load(), "a completed key replays: fn is not called again")

	flushScripts(t, rdb)
	for i := range n {
		require.NoError(t, s.Forget(ctx, key(i)), key(i))
	}
	flushScripts(t, rdb)
	runAll("after Forget")
	require.EqualValues(t, 2*n, runs.Load(), "a forgotten key runs again")

	brief := idem.New[int](idem.Options{Backend: b, TTL: 50 * time.Millisecond, SweepInterval: -1})
	defer brief.Close()
	var briefKeys []string
	flushScripts(t, rdb)
	for i := range 60 {
		k := fmt.Sprintf("brief-%02d", i)
		_, err := brief.RunOnce(ctx, k, i, func(context.Context) (int, error) { return i, nil })
		require.NoError(t, err, k)
		briefKeys = append(briefKeys, k)
	}
	waitGone(t, b, briefKeys)
	flushScripts(t, rdb)
	swept, err := brief.Sweep(ctx)
	require.NoError(t, err)
	assert.Zero(t, swept, "Redis expired the keys itself")
}

// TestClusterSweepForget: on a Cluster, expired keys vanish from every
// primary without a sweep, Sweep removes the index an older release kept,
// and Forget clears a completed key but refuses a live claim.
func TestClusterSweepForget(t *testing.T) {
	rdb := testClusterClient(t)
	t.Run("Sweep", func(t *testing.T) { testSweep(t, rdb, testClusterBackend(t, rdb)) })
	t.Run("Forget", func(t *testing.T) { testForget(t, testClusterBackend(t, rdb)) })
}

// TestSingleSweepForget: the same on a single Redis.
func TestSingleSweepForget(t *testing.T) {
	rdb := testClient(t)
	t.Run("Sweep", func(t *testing.T) { testSweep(t, rdb, testBackend(t, rdb)) })
	t.Run("Forget", func(t *testing.T) { testForget(t, testBackend(t, rdb)) })
}

// testSweep completes keys with a short TTL while an older release's
// expiry index stands, and waits until they have expired: nothing is left
// under the backend's prefix but that index, on any primary, before any
// Sweep (no key grows while nobody sweeps), and a Sweep returns 0 and
// deletes the old index.
func testSweep(t *testing.T, rdb redis.UniversalClient, b *Backend) {
	ctx := context.Background()
	legacy := b.prefix + "expiry"
	require.NoError(t, rdb.ZAdd(ctx, legacy, redis.Z{Score: 1, Member: "from-an-older-release"}).Err())
	s := idem.New[int](idem.Options{Backend: b, TTL: 50 * time.Millisecond, SweepInterval: -1})
	defer s.Close()
	var keys []string
	for i := range 60 {
		k := fmt.Sprintf("done-%02d", i)
		_, err := s.RunOnce(ctx, k, i, func(context.Context) (int, error) { return i, nil })
		require.NoError(t, err, k)
		keys = append(keys, k)
	}
	waitGone(t, b, keys)
	for addr, left := range keysUnder(t, rdb, b.prefix) {
		for _, k := range left {
			assert.Equal(t, legacy, k, "%s: left after the TTL with no sweep", addr)
		}
	}
	entries, err := rdb.ZCard(ctx, legacy).Result()
	require.NoError(t, err)
	assert.EqualValues(t, 1, entries, "Complete added to the old expiry index")

	swept, err := s.Sweep(ctx)
	require.NoError(t, err)
	assert.Zero(t, swept, "Redis expired the keys itself: nothing for Sweep")
	for addr, left := range keysUnder(t, rdb, b.prefix) {
		assert.Empty(t, left, "%s: left after Sweep", addr)
	}
}

// testForget forgets a completed key, which then runs again, and is refused
// a key whose fn is still running, by this store and by another one.
func testForget(t *testing.T, b *Backend) {
	ctx := context.Background()
	s := idem.New[int](idem.Options{Backend: b, TTL: time.Minute, SweepInterval: -1})
	defer s.Close()
	other := idem.New[int](idem.Options{Backend: b, TTL: time.Minute, SweepInterval: -1}) // another process
	defer other.Close()

	var runs atomic.Int32
	fn := func(context.Context) (int, error) { runs.Add(1); return 1, nil }
	_, err := s.RunOnce(ctx, "completed", "p", fn)
	require.NoError(t, err)
	require.NoError(t, s.Forget(ctx, "completed"))
	_, err = s.RunOnce(ctx, "completed", "p", fn)
	require.NoError(t, err)
	assert.EqualValues(t, 2, runs.Load(), "a forgotten key runs again")

	started, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	defer unblock() // before s.Close, which waits for fn
	done := make(chan error, 1)
	go func() {
		_, err := s.RunOnce(ctx, "held", "p", func(context.Context) (int, error) {
			close(started)
			<-release
			return 2, nil
		})
		done <- err
	}()
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("fn did not start")
	}
	require.ErrorIs(t, s.Forget(ctx, "held"), idem.ErrInProgress, "a live claim is not forgotten")
	require.ErrorIs(t, other.Forget(ctx, "held"), idem.ErrInProgress, "nor by another process")
	unblock()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("RunOnce did not return once fn did")
	}
	require.NoError(t, other.Forget(ctx, "held"), "once completed, it can be forgotten")
}

// TestContractCluster runs the store-level contract through RunOnce and
// Begin against a real Redis Cluster.
func TestContractCluster(t *testing.T) {
	rdb := testClusterClient(t)
	idemtest.RunContract(t, idemtest.Harness{
		Backend: func(t *testing.T) backend.Backend {
			return testClusterBackend(t, rdb)
		},
		ServerClock: true,
	})
}

// TestModelCluster drives two stores with idemtest's random model against
// a real Redis Cluster, on its servers' TIME.
func TestModelCluster(t *testing.T) {
	t.Parallel() // beside the other model run, a minute of wall time instead of two
	rdb := testClusterClient(t)
	idemtest.RunModel(t, idemtest.Harness{
		Backend:     func(t *testing.T) backend.Backend { return testClusterBackend(t, rdb) },
		ServerClock: true,
	})
}
