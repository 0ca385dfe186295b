package redis

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/internal/svctest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// privateRedis starts a redis-server of the test's own with a small
// maxmemory and the noeviction policy.
func privateRedis(t *testing.T) *redis.Client {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		svctest.Skipf(t, "redis-server is not on PATH: the full-Redis test starts one of its own")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close())
	dir := t.TempDir()
	cmd := exec.Command(bin, "--port", fmt.Sprint(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", dir, "--maxmemory", "4mb", "--maxmemory-policy", "noeviction", "--logfile", filepath.Join(dir, "log"))
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	rdb := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", port), MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	ctx := context.Background()
	require.Eventually(t, func() bool { return rdb.Ping(ctx).Err() == nil }, 10*time.Second, 10*time.Millisecond, "redis-server did not start")
	return rdb
}

// A Redis that is full (maxmemory reached, noeviction) refuses a new
// claim with Redis's OOM error, and changes nothing; every read still
// answers: a completed key replays, a listing lists (the read-only
// scripts run under OOM, as scripts without flags do on Redis 7), and an
// operator can Forget to make room.
func TestFullRedis(t *testing.T) {
	rdb := privateRedis(t)
	ctx := context.Background()
	b := New(rdb, Options{})
	done := backend.Record{Key: "done", Token: "t1", State: backend.StatePending}
	_, won, err := b.Claim(ctx, done, time.Now(), time.Minute)
	require.NoError(t, err)
	require.True(t, won)
	done.Value = []byte("charged")
	require.NoError(t, b.Complete(ctx, done, time.Now(), time.Hour))

	// Fill it, then set its bound below what it holds: every write is
	// refused from then on, whatever memory a refusal frees.
	filler := strings.Repeat("x", 4096)
	for i := range 256 {
		require.NoError(t, rdb.Set(ctx, fmt.Sprint("fill-", i), filler, 0).Err())
	}
	require.NoError(t, rdb.ConfigSet(ctx, "maxmemory", "1mb").Err())
	require.ErrorContains(t, rdb.Set(ctx, "one-more", "x", 0).Err(), "OOM", "the server is not full")

	_, _, err = b.Claim(ctx, backend.Record{Key: "new", Token: "t2", State: backend.StatePending}, time.Now(), time.Minute)
	require.Error(t, err, "a full Redis took a new claim")
	assert.Contains(t, err.Error(), "OOM")
	_, ok, err := b.Get(ctx, "new", time.Now())
	require.NoError(t, err, "a read on a full Redis")
	assert.False(t, ok, "the refused claim left a record")

	got, ok, err := b.Get(ctx, "done", time.Now())
	require.NoError(t, err, "a read on a full Redis")
	require.True(t, ok)
	assert.Equal(t, "charged", string(got.Value))
	replay, won, err := b.Claim(ctx, backend.Record{Key: "done", Token: "t3", State: backend.StatePending}, time.Now(), time.Minute)
	require.NoError(t, err, "a replay on a full Redis")
	assert.False(t, won)
	assert.Equal(t, "charged", string(replay.Value))
	listed := 0
	require.NoError(t, b.Each(ctx, func(backend.Record) error { listed++; return nil }), "a listing on a full Redis")
	assert.Equal(t, 1, listed)

	require.NoError(t, b.Forget(ctx, "done", time.Now()), "an operator's Forget on a full Redis")
	_, ok, err = b.Get(ctx, "done", time.Now())
	require.NoError(t, err)
	assert.False(t, ok)
}
