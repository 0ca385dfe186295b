// Package redis is an idem.Backend in Redis, shared by every process and
// machine that uses the same Redis (single node, Sentinel or Cluster, through
// redis.UniversalClient).
//
// Each key's record is one Redis string, prefixed with the fields the Lua
// scripts compare: "state|lease|token|" and then the binary record. A claim
// is a SET NX inside a script that also returns the standing record;
// Complete, Release, Renew and Forget are scripts that compare the token, so
// a stale owner can never write over a newer claim. Every script touches one
// key, so all of them work on Redis Cluster.
//
// A completed record is given a Redis TTL at its expiry, so Redis removes it
// itself; a pending or interrupted record has none, since it must outlive a
// dead owner until an operator clears it. Sweep only tidies the expiry index.
//
// Durability: Redis acknowledges a write before it reaches disk unless told
// otherwise. The guarantee that a claim survives a Redis restart needs
// appendonly yes with appendfsync always; with everysec a crash can lose the
// last second of claims and outcomes, and a lost claim lets a retry run
// again. Replication is asynchronous and the backend issues no WAIT, so a
// failover (Sentinel, Cluster) can lose acknowledged claims in the same way.
//
// Clocks: leases and expiry compare the callers' clocks with each other and
// with Redis's (completed records expire at PXAT, their expiry by the
// caller's clock). Keep them in sync. Needs Redis 7.0 or later
// (PEXPIRETIME).
package redis

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/seed094d4201/idem"
)

// Options configure a Backend. The zero value is ready to use.
type Options struct {
	// Prefix starts every Redis key the backend writes. Empty means "idem:".
	Prefix string
}

// Backend is an idem.Backend over Redis. It is safe for concurrent use by
// many goroutines and processes.
type Backend struct {
	rdb    redis.UniversalClient
	prefix string
	index  string // sorted set of completed keys by expiry, for Sweep
	// oneSlot: every key lives on one node (not a Cluster), so a script may
	// touch a record and the index together.
	oneSlot bool
}

var _ idem.Backend = (*Backend)(nil)

// New returns a Backend over rdb. The caller keeps ownership of rdb.
func New(rdb redis.UniversalClient, opts Options) *Backend {
	prefix := opts.Prefix
	if prefix == "" {
		prefix = "idem:"
	}
	_, cluster := rdb.(*redis.ClusterClient)
	return &Backend{rdb: rdb, prefix: prefix, index: prefix + "expiry", oneSlot: !cluster}
}

func (b *Backend) key(k string) string { return b.prefix + "k:" + k }

// encode writes rec as the header the scripts read, then the record.
func encode(rec idem.Record) (string, error) {
	if strings.ContainsRune(rec.Token, '|') {
		return "", fmt.Errorf("redis: token %q holds '|', which the record header reserves", rec.Token)
	}
	blob, err := rec.MarshalBinary()
	if err != nil {
		return "", err
	}
	b := make([]byte, 0, 24+len(rec.Token)+len(blob))
	b = strconv.AppendInt(b, int64(rec.State), 10)
	b = append(b, '|')
	b = strconv.AppendInt(b, millis(rec.LeaseUntil), 10)
	b = append(b, '|')
	b = append(b, rec.Token...)
	b = append(b, '|')
	return string(append(b, blob...)), nil
}

func decode(key, v string) (idem.Record, error) {
	var rec idem.Record
	i := 0
	for n := 0; n < 3; n++ { // skip the header's three fields
		j := strings.IndexByte(v[i:], '|')
		if j < 0 {
			return rec, fmt.Errorf("redis: record %q has no header", key)
		}
		i += j + 1
	}
	if err := rec.UnmarshalBinary([]byte(v[i:])); err != nil {
		return rec, fmt.Errorf("redis: record %q: %w", key, err)
	}
	return rec, nil
}

// millis is t in Unix milliseconds, 0 for the zero Time.
func millis(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

// The scripts. A record's header is "state|lease|token|".
var (
	// KEYS[1] key; ARGV[1] new record, ARGV[2] now (ms). Claims the key if
	// it is free or its record completed and expired, and returns 1; else
	// returns the record. (Not nil for a claim: go-redis treats a nil reply
	// as an error, which costs.)
	claimScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v then
  local st = string.sub(v, 1, 1)
  local expires = tonumber(redis.call('PEXPIRETIME', KEYS[1]))
  if not (st == '2' and expires > 0 and expires <= tonumber(ARGV[2])) then
    return v
  end
end
redis.call('SET', KEYS[1], ARGV[1])
return 1`)

	// KEYS[1] key, and KEYS[2] the expiry index if it is on the same node;
	// ARGV[1] token, ARGV[2] new record, ARGV[3] expiry (ms), ARGV[4] the
	// key's name in the index.
	completeScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if not v then return 0 end
local st, _, tok = string.match(v, '^(%d)|(%d*)|([^|]*)|')
if tok ~= ARGV[1] or st == '2' then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'PXAT', ARGV[3])
if KEYS[2] then redis.call('ZADD', KEYS[2], ARGV[3], ARGV[4]) end
return 1`)

	// KEYS[1] key; ARGV[1] token.
	releaseScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if not v then return 0 end
local st, _, tok = string.match(v, '^(%d)|(%d*)|([^|]*)|')
if tok ~= ARGV[1] or st == '2' then return 0 end
redis.call('DEL', KEYS[1])
return 1`)

	// KEYS[1] key; ARGV[1] token, ARGV[2] record with the new lease,
	// ARGV[3] now (ms). A lapsed lease is not renewed.
	renewScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if not v then return 0 end
local st, lease, tok = string.match(v, '^(%d)|(%d*)|([^|]*)|')
if tok ~= ARGV[1] or st ~= '1' then return 0 end
if lease ~= '0' and tonumber(lease) <= tonumber(ARGV[3]) then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'KEEPTTL')
return 1`)

	// KEYS[1] key; ARGV[1] now (ms). Refuses a pending record whose lease
	// holds.
	forgetScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if not v then return 1 end
local st, lease = string.match(v, '^(%d)|(%d*)|')
if st == '1' and (lease == '0' or tonumber(lease) > tonumber(ARGV[1])) then return 0 end
redis.call('DEL', KEYS[1])
return 1`)

	// KEYS[1] key; ARGV[1] now (ms). Deletes a completed, expired record.
	sweepScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if not v then return 0 end
if string.sub(v, 1, 2) ~= '2|' then return 0 end
local expires = tonumber(redis.call('PEXPIRETIME', KEYS[1]))
if expires > tonumber(ARGV[1]) then return 0 end
redis.call('DEL', KEYS[1])
return 1`)
)

func (b *Backend) Claim(ctx context.Context, rec idem.Record, now time.Time) (idem.Record, bool, error) {
	enc, err := encode(rec)
	if err != nil {
		return idem.Record{}, false, err
	}
	reply, err := claimScript.Run(ctx, b.rdb, []string{b.key(rec.Key)}, enc, now.UnixMilli()).Result()
	if err != nil {
		return idem.Record{}, false, err
	}
	v, ok := reply.(string)
	if !ok {
		return rec, true, nil
	}
	old, err := decode(rec.Key, v)
	return old, false, err
}

func (b *Backend) Complete(ctx context.Context, rec idem.Record) error {
	enc, err := encode(rec)
	if err != nil {
		return err
	}
	expires := rec.ExpiresAt.UnixMilli()
	if b.oneSlot { // the script adds the index entry too: one command
		n, err := completeScript.Run(ctx, b.rdb, []string{b.key(rec.Key), b.index}, rec.Token, enc, expires, rec.Key).Int()
		return owned(n, err, rec.Key)
	}
	// On a Cluster the index is on another node: one round trip all the
	// same, through a pipeline. The entry is harmless if the script
	// refuses, since Sweep checks the record.
	var complete *redis.Cmd
	_, err = b.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		complete = completeScript.Run(ctx, p, []string{b.key(rec.Key)}, rec.Token, enc, expires, rec.Key)
		p.ZAdd(ctx, b.index, redis.Z{Score: float64(expires), Member: rec.Key})
		return nil
	})
	if err != nil && complete.Err() == nil {
		return err
	}
	n, err := complete.Int()
	return owned(n, err, rec.Key)
}

func (b *Backend) Release(ctx context.Context, key, token string) error {
	n, err := releaseScript.Run(ctx, b.rdb, []string{b.key(key)}, token).Int()
	return owned(n, err, key)
}

func (b *Backend) Renew(ctx context.Context, key, token string, now, until time.Time) error {
	rec, ok, err := b.Get(ctx, key)
	if err != nil {
		return err
	}
	if !ok || rec.Token != token || rec.Lapsed(now) {
		return fmt.Errorf("%w: key %q", idem.ErrNotOwner, key)
	}
	rec.LeaseUntil = until
	enc, err := encode(rec)
	if err != nil {
		return err
	}
	n, err := renewScript.Run(ctx, b.rdb, []string{b.key(key)}, token, enc, now.UnixMilli()).Int()
	return owned(n, err, key)
}

// owned turns a script that found the claim not held by the token into
// ErrNotOwner.
func owned(n int, err error, key string) error {
	switch {
	case err != nil:
		return err
	case n == 0:
		return fmt.Errorf("%w: key %q", idem.ErrNotOwner, key)
	}
	return nil
}

func (b *Backend) Get(ctx context.Context, key string) (idem.Record, bool, error) {
	v, err := b.rdb.Get(ctx, b.key(key)).Result()
	switch {
	case errors.Is(err, redis.Nil):
		return idem.Record{}, false, nil
	case err != nil:
		return idem.Record{}, false, err
	}
	rec, err := decode(key, v)
	return rec, err == nil, err
}

func (b *Backend) Forget(ctx context.Context, key string, now time.Time) error {
	n, err := forgetScript.Run(ctx, b.rdb, []string{b.key(key)}, now.UnixMilli()).Int()
	switch {
	case err != nil:
		return err
	case n == 0:
		return fmt.Errorf("%w: key %q is claimed and its lease holds", idem.ErrInProgress, key)
	}
	return b.rdb.ZRem(ctx, b.index, key).Err()
}

// Sweep clears up to limit entries from the expiry index that expired at
// now, soonest first, deleting each one's record if it is still there and
// completed (Redis has most often expired it already), and returns how many
// entries it cleared, so that a caller sweeps on while there are more.
func (b *Backend) Sweep(ctx context.Context, now time.Time, limit int) (int, error) {
	keys, err := b.rdb.ZRangeArgs(ctx, redis.ZRangeArgs{
		Key: b.index, Start: "-inf", Stop: strconv.FormatInt(now.UnixMilli(), 10), ByScore: true, Count: int64(limit),
	}).Result()
	if err != nil || len(keys) == 0 {
		return 0, err
	}
	_, err = b.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		members := make([]any, len(keys))
		for i, k := range keys {
			sweepScript.Run(ctx, p, []string{b.key(k)}, now.UnixMilli())
			members[i] = k
		}
		p.ZRem(ctx, b.index, members...)
		return nil
	})
	if err != nil {
		return 0, err
	}
	return len(keys), nil
}

// Each calls fn for every record under the backend's prefix, stopping at
// fn's first error. It is for inspection (cmd/idem): it SCANs the keyspace,
// every primary's on a Cluster, calling fn from one goroutine at a time.
func (b *Backend) Each(ctx context.Context, fn func(idem.Record) error) error {
	if c, ok := b.rdb.(*redis.ClusterClient); ok {
		var mu sync.Mutex
		return c.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
			return b.each(ctx, node, func(rec idem.Record) error {
				mu.Lock()
				defer mu.Unlock()
				return fn(rec)
			})
		})
	}
	return b.each(ctx, b.rdb, fn)
}

func (b *Backend) each(ctx context.Context, node redis.Cmdable, fn func(idem.Record) error) error {
	iter := node.Scan(ctx, 0, b.prefix+"k:*", 1000).Iterator()
	for iter.Next(ctx) {
		key := strings.TrimPrefix(iter.Val(), b.prefix+"k:")
		rec, ok, err := b.Get(ctx, key)
		if err != nil {
			return err
		}
		if ok {
			if err := fn(rec); err != nil {
				return err
			}
		}
	}
	return iter.Err()
}
