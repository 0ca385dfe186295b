package redis

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/seed094d4201/idem/internal/svctest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// startRedis starts a redis-server of the test's own on a free loopback
// port, with no persistence and the given extra arguments, killed when
// the test ends.
func startRedis(t *testing.T, args ...string) *redis.Client {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		svctest.Skipf(t, "redis-server is not on PATH: this test starts one of its own")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close())
	dir := t.TempDir()
	args = append([]string{"--port", fmt.Sprint(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", dir, "--logfile", filepath.Join(dir, "log")}, args...)
	cmd := exec.Command(bin, args...)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	rdb := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", port), MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	ctx := context.Background()
	require.Eventually(t, func() bool { return rdb.Ping(ctx).Err() == nil }, 10*time.Second, 10*time.Millisecond, "redis-server did not start")
	return rdb
}

// evictingRedis starts a Redis that evicts any key under memory
// pressure, as a cache is set up.
func evictingRedis(t *testing.T) *redis.Client {
	return startRedis(t, "--maxmemory", "2mb", "--maxmemory-policy", "allkeys-lru")
}

// A Redis that may evict keys would forget remembered outcomes: a claim
// on it is refused, with an error that says why and writes nothing, under
// every evicting policy; once the operator sets noeviction, claims go on.
func TestEvictingRedisRefusesClaims(t *testing.T) {
	rdb := evictingRedis(t)
	ctx := context.Background()
	b := New(rdb, Options{})
	for _, policy := range []string{"allkeys-lru", "volatile-lru", "allkeys-random", "volatile-ttl"} {
		require.NoError(t, rdb.ConfigSet(ctx, "maxmemory-policy", policy).Err())
		_, won, err := b.Claim(ctx, backend.Record{Key: "k", Token: "t", State: backend.StatePending}, time.Now(), time.Minute)
		require.ErrorIs(t, err, ErrEvicting, "a claim on a Redis with maxmemory-policy %s", policy)
		assert.ErrorIs(t, err, backend.ErrRefused, "nothing was sent")
		assert.ErrorContains(t, err, policy)
		assert.False(t, won)
		n, err := rdb.DBSize(ctx).Result()
		require.NoError(t, err)
		assert.Zero(t, n, "a refused claim wrote to Redis")
	}

	require.NoError(t, rdb.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err())
	_, won, err := b.Claim(ctx, backend.Record{Key: "k", Token: "t", State: backend.StatePending}, time.Now(), time.Minute)
	require.NoError(t, err, "a claim once the policy is noeviction")
	assert.True(t, won)
}

// Options.AllowEviction accepts the cost: claims go on an evicting Redis.
func TestAllowEvictionClaims(t *testing.T) {
	rdb := evictingRedis(t)
	b := New(rdb, Options{AllowEviction: true})
	_, won, err := b.Claim(context.Background(), backend.Record{Key: "k", Token: "t", State: backend.StatePending}, time.Now(), time.Minute)
	require.NoError(t, err)
	assert.True(t, won)
}

// A managed Redis may refuse CONFIG: the policy is read from INFO memory.
func TestEvictionPolicyFromInfo(t *testing.T) {
	rdb := startRedis(t, "--maxmemory", "2mb", "--maxmemory-policy", "volatile-lru", "--rename-command", "CONFIG", "")
	ctx := context.Background()
	require.Error(t, rdb.ConfigGet(ctx, "maxmemory-policy").Err(), "CONFIG is still allowed")
	_, _, err := New(rdb, Options{}).Claim(ctx, backend.Record{Key: "k", Token: "t", State: backend.StatePending}, time.Now(), time.Minute)
	require.ErrorIs(t, err, ErrEvicting)
	assert.ErrorContains(t, err, "volatile-lru")
}

// The operator-settings conformance checks on an evicting Redis: with its
// default options the backend never lets an eviction run an operation
// twice.
func TestOperatorSettings(t *testing.T) {
	idemtest.RunOperator(t, idemtest.Operator{
		Evicting: func(t *testing.T) backend.Backend { return New(evictingRedis(t), Options{}) },
		Evict:    evict,
	})
}

// evict writes to b's Redis until it has evicted key's record, or fails
// the test.
func evict(t *testing.T, b backend.Backend, key string) {
	t.Helper()
	be := b.(*Backend)
	ctx := context.Background()
	filler := strings.Repeat("x", 16<<10)
	for round := range 200 { // 200 rounds of 1 MiB against a maxmemory of 2 MiB
		n, err := be.rdb.Exists(ctx, be.key(key)).Result() // EXISTS does not touch the key's LRU clock
		require.NoError(t, err)
		if n == 0 {
			return
		}
		_, err = be.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i := range 64 {
				p.Set(ctx, fmt.Sprintf("filler:%d:%d", round, i), filler, 0)
			}
			return nil
		})
		require.NoError(t, err)
	}
	t.Fatalf("Redis never evicted %q", key)
}

// On a Cluster every primary is asked: one master that evicts is enough
// for a claim to be refused, whichever node the key lives on.
func TestEvictingClusterPrimaryRefusesClaims(t *testing.T) {
	rdb := testClusterClient(t).(*redis.ClusterClient)
	ctx := context.Background()
	var evicting string
	require.NoError(t, rdb.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
		return node.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err()
	}))
	var once sync.Once
	require.NoError(t, rdb.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) (err error) {
		once.Do(func() {
			evicting = node.Options().Addr
			err = node.ConfigSet(ctx, "maxmemory-policy", "volatile-lfu").Err()
		})
		return err
	}))
	t.Cleanup(func() {
		_ = rdb.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
			return node.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err()
		})
	})

	b := testClusterBackend(t, rdb)
	for _, key := range []string{"a", "b", "c", "d", "e"} { // on more than one node
		_, _, err := b.Claim(ctx, backend.Record{Key: key, Token: "t", State: backend.StatePending}, time.Now(), time.Minute)
		require.ErrorIs(t, err, ErrEvicting, "key %q", key)
		assert.ErrorContains(t, err, evicting+" has maxmemory-policy volatile-lfu")
	}
}

// A policy found to be noeviction is read again once policyRecheck has
// passed: an operator who sets an evicting policy later, or a Cluster
// that gains an evicting master, has claims refused from then on, not
// never. (Before, the first pass was kept for ever.)
func TestEvictionPolicyChangedLaterIsNoticed(t *testing.T) {
	rdb := startRedis(t, "--maxmemory", "2mb", "--maxmemory-policy", "noeviction")
	ctx := context.Background()
	b := New(rdb, Options{})
	claim := func(key string) (bool, error) {
		_, won, err := b.Claim(ctx, backend.Record{Key: key, Token: "t", State: backend.StatePending}, time.Now(), time.Minute)
		return won, err
	}
	won, err := claim("first")
	require.NoError(t, err)
	require.True(t, won)

	require.NoError(t, rdb.ConfigSet(ctx, "maxmemory-policy", "allkeys-lru").Err())
	b.policy.lapse() // policyRecheck has passed since the policy was read
	_, err = claim("after")
	require.ErrorIs(t, err, ErrEvicting, "a claim after the operator set allkeys-lru")
	assert.ErrorContains(t, err, "allkeys-lru")
}

// A server too busy to answer CONFIG or INFO (a script past its time
// limit: BUSY) has not told its policy: the claim fails, and the policy
// is read again at the next, which an evicting server refuses. (Before,
// BUSY was taken for a refusal of the commands, the policy for one that
// cannot be told, and the pass kept for ever.)
func TestEvictionPolicyUnreadWhileBusyIsReadAgain(t *testing.T) {
	rdb := startRedis(t, "--maxmemory", "2mb", "--maxmemory-policy", "allkeys-lru", "--busy-reply-threshold", "50")
	ctx := context.Background()
	b := New(rdb, Options{})
	script := redis.NewClient(&redis.Options{Addr: rdb.Options().Addr, MaxRetries: -1})
	t.Cleanup(func() { script.Close() })
	ran := make(chan error, 1)
	go func() { ran <- script.Eval(ctx, "while true do end", nil).Err() }()
	require.Eventually(t, func() bool {
		err := rdb.Ping(ctx).Err()
		return err != nil && strings.HasPrefix(err.Error(), "BUSY")
	}, 10*time.Second, 5*time.Millisecond, "the script never made the server busy")

	_, won, err := b.Claim(ctx, backend.Record{Key: "k", Token: "t", State: backend.StatePending}, time.Now(), time.Minute)
	require.Error(t, err, "a claim on a busy server")
	assert.False(t, won)

	require.NoError(t, rdb.ScriptKill(ctx).Err())
	require.Error(t, <-ran, "the script was killed")
	_, won, err = b.Claim(ctx, backend.Record{Key: "k", Token: "t", State: backend.StatePending}, time.Now(), time.Minute)
	require.ErrorIs(t, err, ErrEvicting, "a claim once the server answers again")
	assert.False(t, won)
}

// unreadablePolicy is a hook that, while on, fails CONFIG and INFO as an
// unreachable node would, and lets every other command through.
type unreadablePolicy struct{ on atomic.Bool }

func (u *unreadablePolicy) DialHook(next redis.DialHook) redis.DialHook { return next }
func (u *unreadablePolicy) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (u *unreadablePolicy) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if name := cmd.Name(); u.on.Load() && (name == "config" || name == "info") {
			err := &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}
			cmd.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}
}

// A policy found to be noeviction that cannot be read again when its pass
// ends (a primary unreachable for a moment, as in a Cluster's failover)
// keeps its pass a while longer: claims go on as before the pass ended,
// rather than every claim, on every node, failing until that primary
// answers.
func TestEvictionPolicyUnreadAfterAPassKeepsIt(t *testing.T) {
	rdb := startRedis(t, "--maxmemory", "2mb", "--maxmemory-policy", "noeviction")
	hook := new(unreadablePolicy)
	rdb.AddHook(hook)
	ctx := context.Background()
	b := New(rdb, Options{})
	claim := func(key string) error {
		_, _, err := b.Claim(ctx, backend.Record{Key: key, Token: "t", State: backend.StatePending}, time.Now(), time.Minute)
		return err
	}
	require.NoError(t, claim("first"))
	hook.on.Store(true)
	b.policy.lapse()
	require.NoError(t, claim("second"), "a claim whose policy's pass ended while the policy cannot be read")
	require.NoError(t, claim("third"))

	// Once it answers again, the policy is read.
	hook.on.Store(false)
	require.NoError(t, rdb.ConfigSet(ctx, "maxmemory-policy", "allkeys-lru").Err())
	b.policy.lapse()
	require.ErrorIs(t, claim("fourth"), ErrEvicting)
}

// On a Cluster, a master set to evict after the pass is seen at the next
// read of the policy, whichever node the next claim's key lives on.
func TestEvictingClusterPrimaryLaterIsNoticed(t *testing.T) {
	rdb := testClusterClient(t).(*redis.ClusterClient)
	ctx := context.Background()
	require.NoError(t, rdb.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
		return node.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err()
	}))
	t.Cleanup(func() {
		_ = rdb.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
			return node.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err()
		})
	})
	b := testClusterBackend(t, rdb)
	_, won, err := b.Claim(ctx, backend.Record{Key: "first", Token: "t", State: backend.StatePending}, time.Now(), time.Minute)
	require.NoError(t, err)
	require.True(t, won)

	var evicting string
	var once sync.Once
	require.NoError(t, rdb.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) (err error) {
		once.Do(func() {
			evicting = node.Options().Addr
			err = node.ConfigSet(ctx, "maxmemory-policy", "allkeys-lru").Err()
		})
		return err
	}))
	// policyRecheck has passed.
	b.policy.lapse()
	for _, key := range []string{"a", "b", "c", "d", "e"} { // on more than one node
		_, _, err := b.Claim(ctx, backend.Record{Key: key, Token: "t", State: backend.StatePending}, time.Now(), time.Minute)
		require.ErrorIs(t, err, ErrEvicting, "key %q", key)
		assert.ErrorContains(t, err, evicting+" has maxmemory-policy allkeys-lru")
	}
}
