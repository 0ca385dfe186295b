package redis

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/seed094d4201/idem/backend"
)

// ErrEvicting is matched by the error of a claim that the backend refused
// because the Redis server may evict keys: its maxmemory-policy is not
// noeviction. An evicted completed record is a forgotten outcome, and the
// next call with its key runs the operation again (allkeys-* policies take
// any record; volatile-* ones take completed records, which carry a TTL).
// Set maxmemory-policy noeviction on the server, or Options.AllowEviction
// to accept that cost.
var ErrEvicting = errors.New("redis: the server may evict keys (maxmemory-policy is not noeviction), and an evicted outcome would let its operation run again")

// policyRecheck is how long a pass holds: the policy is read again before
// the first claim after it, so that one an operator changes to an
// evicting policy, or a Cluster master added later, is seen within it. A
// read per primary a minute costs nothing beside the claims.
const policyRecheck = time.Minute

// policyRetry is how much longer a pass holds when the policy cannot be
// read again as it ends (a primary unreachable for a moment, as in a
// Cluster's failover): claims go on as they did, and the policy is asked
// for again after it, not before every claim.
const policyRetry = 5 * time.Second

// A policyCheck remembers when every primary was last found not to
// evict, so that the policy is read only before the first claim, while it
// fails, and once a pass is policyRecheck old.
type policyCheck struct {
	// until is when the last pass ends, as nanoseconds on this process's
	// monotonic clock since policyEpoch; 0 before the first pass.
	until atomic.Int64
	// passed: a pass was given once; a read that fails after it keeps
	// it, rather than fail every claim on every node while one primary
	// cannot answer.
	passed atomic.Bool
}

// policyEpoch is the origin of policyCheck.until's monotonic readings.
var policyEpoch = time.Now()

// due reports whether the policy is to be read before the next claim: no
// pass holds.
func (p *policyCheck) due() bool {
	return time.Since(policyEpoch).Nanoseconds() >= p.until.Load()
}

// lapse ends the current pass, as policyRecheck's passing does.
func (p *policyCheck) lapse() { p.until.Store(0) }

// check returns nil if no primary rdb writes to evicts keys, or if that
// cannot be told (every primary refuses both CONFIG and INFO); an error
// matching ErrEvicting (and backend.ErrRefused) if one does; or the error
// that kept it from asking, before any pass (after one, the pass is kept
// for policyRetry more). A pass is kept for policyRecheck; a refusal is
// not, so that a claim after the operator changed the policy reads it
// again.
func (p *policyCheck) check(ctx context.Context, rdb redis.UniversalClient) error {
	now := time.Since(policyEpoch)
	if now.Nanoseconds() < p.until.Load() {
		return nil
	}
	var mu sync.Mutex
	var evicting []string
	err := eachPrimary(ctx, rdb, func(ctx context.Context, node redis.Cmdable, addr string) error {
		policy, err := evictionPolicy(ctx, node)
		if err != nil {
			return err
		}
		if policy != "" && policy != "noeviction" {
			mu.Lock()
			evicting = append(evicting, fmt.Sprintf("%s has maxmemory-policy %s", addr, policy))
			mu.Unlock()
		}
		return nil
	})
	switch {
	case err != nil && p.passed.Load():
		p.until.Store((now + policyRetry).Nanoseconds())
		return nil
	case err != nil:
		return backend.Refuse(fmt.Errorf("redis: reading the server's maxmemory-policy before a claim: %w", err))
	case len(evicting) > 0:
		return backend.Refuse(fmt.Errorf("%w: %s; set it to noeviction, or Options.AllowEviction to accept that cost", ErrEvicting, strings.Join(evicting, ", ")))
	}
	p.passed.Store(true)
	p.until.Store((time.Since(policyEpoch) + policyRecheck).Nanoseconds())
	return nil
}

// eachPrimary calls fn with every primary rdb writes to: each master of a
// Cluster, each shard of a Ring, or the one server (a Sentinel client's
// current primary).
func eachPrimary(ctx context.Context, rdb redis.UniversalClient, fn func(ctx context.Context, node redis.Cmdable, addr string) error) error {
	switch c := rdb.(type) {
	case *redis.ClusterClient:
		return c.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error { return fn(ctx, node, node.Options().Addr) })
	case *redis.Ring:
		return c.ForEachShard(ctx, func(ctx context.Context, node *redis.Client) error { return fn(ctx, node, node.Options().Addr) })
	case *redis.Client:
		return fn(ctx, c, c.Options().Addr)
	}
	return fn(ctx, rdb, "the server")
}

// evictionPolicy returns node's maxmemory-policy: from CONFIG GET, or, on
// a server that refuses CONFIG (a managed Redis may rename or forbid it),
// from INFO memory's maxmemory_policy field. It returns "" when the server
// answers neither: the policy cannot be told, and the claim goes on.
func evictionPolicy(ctx context.Context, node redis.Cmdable) (string, error) {
	conf, err := node.ConfigGet(ctx, "maxmemory-policy").Result()
	if err == nil && conf["maxmemory-policy"] != "" {
		return conf["maxmemory-policy"], nil
	}
	if err != nil && !refusedByServer(err) {
		return "", err
	}
	info, err := node.Info(ctx, "memory").Result()
	if err != nil {
		if refusedByServer(err) {
			return "", nil
		}
		return "", err
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "maxmemory_policy:"); ok {
			return v, nil
		}
	}
	return "", nil
}

// refusedByServer reports whether err is the server's refusal of a
// command it will not run for this client: unknown (renamed away, as a
// managed Redis does; "ERR unknown command") or forbidden by its ACL
// ("NOPERM"). Not any error reply: one that says the server cannot answer
// now (BUSY with a script, LOADING its data, MASTERDOWN, CLUSTERDOWN,
// TRYAGAIN) has not told the policy, and taking it for a refusal would
// take the policy for one that cannot be told.
func refusedByServer(err error) bool {
	var rerr redis.Error
	if !errors.As(err, &rerr) || errors.Is(err, redis.Nil) {
		return false
	}
	msg := rerr.Error()
	return strings.HasPrefix(msg, "ERR ") || strings.HasPrefix(msg, "NOPERM")
}
