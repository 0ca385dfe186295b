// Package redis is an backend.Backend in Redis, shared by every process and
// machine that uses the same Redis (a single node or a Cluster, through
// redis.UniversalClient).
//
// Each key's record is one Redis string, prefixed with the fields the Lua
// scripts compare: "state|lease|token|created|" and then the binary record. A claim
// is a SET NX inside a script that also returns the standing record;
// Complete, Release, Renew and Forget are scripts that compare the token, so
// a stale owner can never write over a newer claim. Every script touches one
// key, so all of them work on Redis Cluster.
//
// A record with steps (backend.Stepper) has a fifth header field, the
// length of its steps, which follow the binary record as
// backend.AppendSteps writes them: "state|lease|token|created|n|", the
// record, n bytes of steps. The scripts never read the steps, only carry
// them over (Complete) or keep the value's tail whole (Renew, Resume), and
// a record without steps is stored byte for byte as before steps.
//
// A completed record is given a Redis TTL at its expiry, so Redis removes it
// itself; a pending or interrupted record has none, since it must outlive a
// dead owner until an operator clears it. So the backend keeps no index of
// expiries, which would be a hot key on one node, a write on every
// Complete, and a set that grows without bound whenever no process sweeps:
// Sweep has nothing to delete (backend.SelfExpiring). It only removes the
// sorted set "<prefix>expiry" that releases before this one kept.
//
// Durability: Redis acknowledges a write before it reaches disk unless told
// otherwise. The guarantee that a claim survives a Redis restart needs
// appendonly yes with appendfsync always; with everysec a crash can lose the
// last second of claims and outcomes, and a lost claim lets a retry run
// again. Replication is asynchronous and the backend issues no WAIT, so a
// failover can lose acknowledged claims in the same way.
//
// Clocks: every lease and expiry is made and judged by the Redis server's
// clock (TIME, inside the scripts), from durations the Store sends, so skew
// between the machines that use it cannot hand a live claim to a second
// owner. Needs Redis 7.0 or later (PEXPIRETIME, and scripts that read TIME).
//
// The header gained its created field in the release that moved time into
// the scripts: this version reads values written by the one before, but not
// the other way round, so stop the replicas of the older version before the
// newer one writes records.
//
// Eviction: a Redis whose maxmemory-policy evicts keys would drop
// remembered outcomes as if they were cache entries, and a call after an
// eviction runs its operation again. So claims are refused (ErrEvicting)
// on such a server unless Options.AllowEviction accepts that cost; see
// New. The policy the backend needs is noeviction.
//
// A full Redis (maxmemory reached under the noeviction policy) refuses a
// new claim with its OOM error and writes nothing, while replays, reads,
// listings and Forget go on: the scripts carry no "#!lua flags=" line, so
// Redis 7 judges memory at their first write, not at their start (a
// "no-writes" flag would change nothing for the read-only ones; a flags
// line without it would refuse them).
//
// Scripts are sent by hash and loaded on a server that has not cached them
// (a new or restarted server, a failover, every node of a new Cluster);
// inside pipelines they are sent whole.
//
// Contexts: every Backend call returns once its ctx ends, by its deadline
// or by a cancellation, whatever the client's options, even against a
// server that never answers (go-redis alone would wait for its socket
// timeouts, and ends a command at a cancellation never). A call whose ctx
// can end is waited on from a goroutine of its own, which it leaves when
// ctx ends (the backend's senders, each of which waits 50 ms for another
// command after one, and then ends): the command goes on in the background until the client gives
// up on it (its socket timeouts), and may still land, which the Store
// settles by the claim's token as it does a lost reply. A call whose ctx
// can never end runs in the caller's goroutine. A call whose ctx had
// already ended is refused (backend.ErrRefused): nothing is
// sent. An unreachable server is answered
// with go-redis's connection error once the client's own retries are
// spent (MaxRetries, DialerRetries, DialerRetryTimeout: up to about 2 s
// with the defaults). Each, for inspection, is the exception: its SCAN
// pages end with the client's timeouts only.
package redis

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
)

// Options configure a Backend. The zero value is ready to use.
type Options struct {
	// Prefix starts every Redis key the backend writes. Empty means "idem:".
	Prefix string

	// AllowEviction lets the backend claim keys on a Redis whose
	// maxmemory-policy may evict them (anything but noeviction), and so
	// accepts what that costs: a completed record that Redis evicts is a
	// forgotten outcome, and the next call with its key runs the
	// operation again (volatile-* policies evict completed records, which
	// carry a TTL; allkeys-* ones pending records too, whose duplicates
	// then run at once). False means a claim on such a Redis is refused
	// with an error matching ErrEvicting (see New).
	AllowEviction bool
}

// Backend is an backend.Backend over Redis. It is safe for concurrent use by
// many goroutines and processes.
type Backend struct {
	rdb redis.UniversalClient
	// routed: rdb routes commands by key (a Cluster or a Ring).
	routed bool
	// lease and ttl box the last lease and TTL the calls passed.
	lease, ttl msArg
	prefix     string
	// legacyIndex is the sorted set of completed keys by expiry that
	// releases before this one wrote on every Complete; Sweep deletes it
	// if it is one, and stops looking once it has found none.
	legacyIndex string
	legacyGone  atomic.Bool
	dials       *dialWatch // a hook on rdb: how its latest dial ended
	senders     senders    // the goroutines calls whose ctx can end are sent from
	// policy checks, before a claim, that no primary evicts keys; nil
	// with Options.AllowEviction.
	policy *policyCheck
}

var (
	_ backend.Backend      = (*Backend)(nil)
	_ backend.SelfExpiring = (*Backend)(nil)
)

// New returns a Backend over rdb. The caller keeps ownership of rdb. New
// adds a hook to rdb (AddHook) that watches its dials, so that a call can
// tell an unreachable server from a slow one.
//
// Unless opts.AllowEviction, claims are refused (ErrEvicting) while a
// primary's maxmemory-policy is not noeviction: New sends nothing, so the
// policy is read before the first claim, and again before each claim
// until every primary is found not to evict (a Cluster's masters, a Ring's
// shards). It comes from CONFIG GET, or, where a managed Redis refuses
// CONFIG, from INFO memory; a server that refuses both is taken not to
// evict, and one that cannot answer now (BUSY, LOADING) fails the claim.
// A pass holds for a minute, after which the policy is read again before
// the next claim (if it cannot be read then, a primary unreachable for a
// moment, the pass holds a few seconds more): a policy changed to an
// evicting one later, or an evicting master added to a Cluster, has claims
// refused from then on (records written before may be evicted meanwhile:
// the policy is the operator's to keep at noeviction). Reads, Forget and
// listings never check it: an operator's tool works on any Redis.
func New(rdb redis.UniversalClient, opts Options) *Backend {
	prefix := opts.Prefix
	if prefix == "" {
		prefix = "idem:"
	}
	dials := new(dialWatch)
	rdb.AddHook(dials)
	b := &Backend{rdb: rdb, prefix: prefix, legacyIndex: prefix + "expiry", dials: dials,
		senders: senders{next: make(chan *evalCmd)}}
	_, single := rdb.(*redis.Client)
	b.routed = !single
	if !opts.AllowEviction {
		b.policy = new(policyCheck)
	}
	return b
}

func (b *Backend) key(k string) string { return b.prefix + "k:" + k }

// blob is rec's binary encoding, which follows the header the scripts
// write. Its own times and token are not read back: the header's are.
// go-redis sends a []byte argument as it is, with no copy.
func blob(rec backend.Record) ([]byte, error) { return rec.MarshalBinary() }

// A value is a stored value taken apart: the header's fields, the binary
// record, and the steps that follow it (backend.AppendSteps; empty for a
// record without steps).
type value struct {
	state, lease, token string
	// created is "" in values written before the header had it, which keep
	// the record's own; such a value has no steps.
	created       string
	record, steps string
}

func parseValue(key, v string) (value, error) {
	var fields [3]string
	rest := v
	for n := range fields {
		j := strings.IndexByte(rest, '|')
		if j < 0 {
			return value{}, fmt.Errorf("redis: record %q has no header", key)
		}
		fields[n], rest = rest[:j], rest[j+1:]
	}
	val := value{state: fields[0], lease: fields[1], token: fields[2]}
	// The binary record starts with its version, a byte below '0', so a
	// field of digits before it is the header's.
	var ok bool
	if val.created, rest, ok = digits(rest); ok {
		if n, tail, ok := digits(rest); ok {
			size, err := strconv.Atoi(n)
			if err != nil || size > len(tail) {
				return value{}, fmt.Errorf("redis: record %q: steps of %s bytes in a value of %d", key, n, len(tail))
			}
			rest, val.steps = tail[:len(tail)-size], tail[len(tail)-size:]
		}
	}
	val.record = rest
	return val, nil
}

// digits splits a leading header field of digits, ended by '|', off s.
func digits(s string) (field, rest string, ok bool) {
	j := strings.IndexByte(s, '|')
	if j <= 0 || strings.Trim(s[:j], "0123456789") != "" {
		return "", s, false
	}
	return s[:j], s[j+1:], true
}

// String is the value as stored.
func (v value) String() string {
	h := v.state + "|" + v.lease + "|" + v.token + "|"
	if v.created != "" {
		h += v.created + "|"
	}
	if v.steps != "" {
		h += strconv.Itoa(len(v.steps)) + "|"
	}
	return h + v.record + v.steps
}

// decode reads a stored value. expires is the key's expiry (ms), lapsed
// whether the server found its lease lapsed.
func decode(key, v string, expires int64, lapsed bool) (backend.Record, error) {
	val, err := parseValue(key, v)
	if err != nil {
		return backend.Record{}, err
	}
	var rec backend.Record
	if err := rec.UnmarshalBinary([]byte(val.record)); err != nil {
		return rec, fmt.Errorf("redis: record %q: %w", key, err)
	}
	if rec.Steps, err = backend.ReadSteps([]byte(val.steps)); err != nil {
		return rec, fmt.Errorf("redis: record %q: %w", key, err)
	}
	state, err := strconv.Atoi(val.state)
	if err != nil || state < int(backend.StatePending) || state > int(backend.StateInterrupted) {
		// A later version's state, or a damaged value: not a record to
		// act on (a Resolve would take it for interrupted, and the
		// complete script, which refuses only '2', write over it).
		return rec, fmt.Errorf("redis: record %q: unknown state %q", key, val.state)
	}
	lease, _ := strconv.ParseInt(val.lease, 10, 64)
	rec.State, rec.LeaseUntil, rec.Token = backend.RecordState(state), fromMillis(lease), val.token
	if val.created != "" {
		created, _ := strconv.ParseInt(val.created, 10, 64)
		rec.CreatedAt = fromMillis(created)
	}
	rec.ExpiresAt = time.Time{}
	if rec.State == backend.StateCompleted {
		rec.ExpiresAt = fromMillis(expires)
	}
	if lapsed {
		rec.State = backend.StateInterrupted
	}
	return rec, nil
}

// millis is d in milliseconds, the unit the scripts take, rounded up: a
// positive lease or TTL never becomes zero, which means none.
func millis(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	n := int64(d / time.Millisecond)
	if d%time.Millisecond != 0 {
		n++
	}
	return n
}

// fromMillis is the instant ms milliseconds after 1970, or the zero Time for
// zero or less (no lease, no expiry).
func fromMillis(ms int64) time.Time {
	if ms <= 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms)
}

// The scripts. A record's value is "state|lease|token|created|" and the
// binary record (with steps, their length and then them: see the package
// doc, and steps.go for the scripts of backend.Stepper); lease and created are milliseconds by the server's clock,
// which every script reads with TIME, so the callers' clocks never decide a
// lease or an expiry. (Redis 7 replicates a script's effects, not the
// script, so reading TIME is allowed.) A completed record expires at PXAT.
const (
	// luaNow sets now to the server's time in milliseconds. TIME costs
	// about as much as a GET inside a script, so the scripts read it only
	// where they judge a lease; a completed record's expiry is Redis's own
	// key expiry, which Redis applies by its clock before any script sees
	// the key.
	luaNow = `local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
`
	// luaSeen returns the standing value v of KEYS[1] as the server sees it:
	// {v, expiry in ms, 1 if it is pending and its lease lapsed}.
	luaSeen = `local st, lease = string.match(v, '^(%d)|(%d*)|')
if st == '2' then return {v, redis.call('PEXPIRETIME', KEYS[1]), 0} end
local lapsed = 0
if st == '1' and lease ~= '0' then
` + luaNow + `  if tonumber(lease) <= now then lapsed = 1 end
end
return {v, -1, lapsed}
`
)

var (
	// KEYS[1] key; ARGV[1] token, ARGV[2] lease (ms), ARGV[3] binary
	// record. Claims the key if it is free (Redis has dropped an expired
	// record), and returns now; else returns the standing record, seen.
	claimScript = newScript(`local v = redis.call('GET', KEYS[1])
if v then
` + luaSeen + `end
` + luaNow + `local lease = 0
if tonumber(ARGV[2]) > 0 then lease = now + ARGV[2] end
redis.call('SET', KEYS[1], '1|' .. lease .. '|' .. ARGV[1] .. '|' .. now .. '|' .. ARGV[3])
return now`)

	// KEYS[1] key. Returns the record, seen, or nil.
	getScript = newScript(`local v = redis.call('GET', KEYS[1])
if not v then return nil end
` + luaSeen)

	// KEYS[1] key; ARGV[1] token, ARGV[2] binary record, ARGV[3] TTL
	// (ms). Returns 1, or 0 if
	// the token does not hold an unsettled claim. The record expires PX
	// after the server's now, and keeps its steps: the steps' length field,
	// if the header has one (digits after created, where a record starts
	// with its version byte), and the steps at the value's end. (A value
	// written before the header had its created field has an empty one
	// here, and no steps.) It keeps its fingerprint too, whatever ARGV[2]
	// holds: every binary record starts with its version, state, key
	// length, key and then the 32 bytes of fingerprint, which are copied
	// from the stored record into the new one.
	completeScript = newScript(`local v = redis.call('GET', KEYS[1])
if not v then return 0 end
local st, tok, created, e = string.match(v, '^(%d)|%d*|([^|]*)|(%d*)|?()')
if tok ~= ARGV[1] or st == '2' then return 0 end
if created == '' then created = '0' end
local n, steps = string.match(v, '^(%d+)|', e), ''
if n then steps = string.sub(v, -tonumber(n)); e = e + #n + 1; n = n .. '|' else n = '' end
local fp = e + 3 + string.byte(v, e + 2)
local rec, at = ARGV[2], 4 + string.byte(ARGV[2], 3)
rec = string.sub(rec, 1, at - 1) .. string.sub(v, fp, fp + 31) .. string.sub(rec, at + 32)
redis.call('SET', KEYS[1], '2|0|' .. tok .. '|' .. created .. '|' .. n .. rec .. steps, 'PX', ARGV[3])
return 1`)

	// KEYS[1] key; ARGV[1] token.
	releaseScript = newScript(`
local v = redis.call('GET', KEYS[1])
if not v then return 0 end
local st, _, tok = string.match(v, '^(%d)|(%d*)|([^|]*)|')
if tok ~= ARGV[1] or st == '2' then return 0 end
redis.call('DEL', KEYS[1])
return 1`)

	// KEYS[1] key; ARGV[1] token, ARGV[2] lease (ms). A lapsed lease is
	// renewed too: its owner is alive (backend.Backend).
	renewScript = newScript(luaNow + `
local v = redis.call('GET', KEYS[1])
if not v then return 0 end
local _, e, st, lease, tok = string.find(v, '^(%d)|(%d*)|([^|]*)|')
if tok ~= ARGV[1] or st ~= '1' then return 0 end
redis.call('SET', KEYS[1], '1|' .. (now + tonumber(ARGV[2])) .. '|' .. tok .. '|' .. string.sub(v, e + 1), 'KEEPTTL')
return 1`)

	// KEYS[1] key. Refuses a pending record whose lease holds.
	forgetScript = newScript(luaNow + `
local v = redis.call('GET', KEYS[1])
if not v then return 1 end
local st, lease = string.match(v, '^(%d)|(%d*)|')
if st == '1' and (lease == '0' or tonumber(lease) > now) then return 0 end
redis.call('DEL', KEYS[1])
return 1`)
)

// Claim claims rec.Key, judging leases and expiry by the server's clock;
// now is ignored.
func (b *Backend) Claim(ctx context.Context, rec backend.Record, _ time.Time, lease time.Duration) (backend.Record, bool, error) {
	// A ctx that had ended is refused: nothing is sent, so the Store need
	// not read the claim back.
	if err := ctx.Err(); err != nil {
		return backend.Record{}, false, backend.Refuse(err)
	}
	if b.policy != nil && b.policy.due() {
		// Read once a minute at most, bounded by ctx as every call is.
		start := time.Now()
		if err := bound0(ctx, b.dials, func(ctx context.Context) error { return b.policy.check(ctx, b.rdb) }); err != nil {
			// The claim was not sent.
			return backend.Record{}, false, unreachable(ctx, b.dials, start, backend.Refuse(err))
		}
	}
	enc, err := blob(backend.Record{Key: rec.Key, Fingerprint: rec.Fingerprint, State: backend.StatePending})
	if err != nil {
		return backend.Record{}, false, err
	}
	if strings.ContainsRune(rec.Token, '|') {
		return backend.Record{}, false, fmt.Errorf("redis: token %q holds '|', which the record header reserves", rec.Token)
	}
	cmd, err := b.call(ctx, b.evalRecord(claimScript, rec.Key).token(rec.Token).arg(b.lease.of(lease, 0)).record(enc))
	if err != nil {
		return backend.Record{}, false, err
	}
	reply := cmd.Val()
	if now, ok := reply.(int64); ok {
		claim := backend.Record{Key: rec.Key, Fingerprint: rec.Fingerprint, Token: rec.Token, State: backend.StatePending, CreatedAt: time.UnixMilli(now)}
		if lease > 0 {
			claim.LeaseUntil = claim.CreatedAt.Add(time.Duration(millis(lease)) * time.Millisecond)
		}
		return claim, true, nil
	}
	old, err := decodeSeen(rec.Key, reply)
	return old, false, err
}

// decodeSeen decodes a script's {value, expiry, lapsed} reply.
func decodeSeen(key string, reply any) (backend.Record, error) {
	s, ok := reply.([]any)
	if !ok || len(s) != 3 {
		return backend.Record{}, fmt.Errorf("redis: record %q: unexpected reply %T", key, reply)
	}
	v, _ := s[0].(string)
	expires, _ := s[1].(int64)
	lapsed, _ := s[2].(int64)
	return decode(key, v, expires, lapsed == 1)
}

// Complete records the outcome, expiring ttl after the server's now. The
// record keeps the fingerprint it was claimed with, which the script copies
// into the encoding sent here, whatever rec.Fingerprint holds.
func (b *Backend) Complete(ctx context.Context, rec backend.Record, _ time.Time, ttl time.Duration) error {
	if err := ctx.Err(); err != nil {
		return backend.Refuse(err)
	}
	enc, err := blob(backend.Record{Key: rec.Key, State: backend.StateCompleted,
		Value: rec.Value, Failed: rec.Failed, ErrMsg: rec.ErrMsg})
	if err != nil {
		return err
	}
	return b.owned(ctx, b.evalRecord(completeScript, rec.Key).token(rec.Token).record(enc).arg(b.ttl.of(ttl, 1)), rec.Key)
}

// owned sends c, a script that answers 1, or 0 if the token does not hold
// the key's claim.
func (b *Backend) owned(ctx context.Context, c *evalCmd, key string) error {
	cmd, err := b.call(ctx, c)
	if err != nil {
		return err
	}
	n, err := cmd.Int64()
	return backend.Owned(n, err, key)
}

func (b *Backend) Release(ctx context.Context, key, token string) error {
	return b.owned(ctx, b.evalRecord(releaseScript, key).token(token), key)
}

// Renew extends the lease to lease after the server's now.
func (b *Backend) Renew(ctx context.Context, key, token string, _ time.Time, lease time.Duration) error {
	return b.owned(ctx, b.evalRecord(renewScript, key).token(token).arg(b.lease.of(lease, 0)), key)
}

// Get returns key's record as the server's clock sees it.
func (b *Backend) Get(ctx context.Context, key string, _ time.Time) (backend.Record, bool, error) {
	cmd, err := b.call(ctx, b.evalRecord(getScript, key))
	switch {
	case errors.Is(err, redis.Nil):
		return backend.Record{}, false, nil
	case err != nil:
		return backend.Record{}, false, err
	}
	rec, err := decodeSeen(key, cmd.Val())
	return rec, err == nil, err
}

// Forget judges the lease by the server's clock.
func (b *Backend) Forget(ctx context.Context, key string, _ time.Time) error {
	cmd, err := b.call(ctx, b.evalRecord(forgetScript, key))
	if err != nil {
		return err
	}
	if n, err := cmd.Int(); err != nil {
		return err
	} else if n == 0 {
		return fmt.Errorf("%w: key %q is claimed and its lease holds", idem.ErrInProgress, key)
	}
	return nil
}

// Sweep deletes nothing and returns 0: Redis deletes a completed record
// itself at its expiry, by the server's clock. It deletes the expiry index
// an earlier release kept, if there is one (a replica of that release may
// still be writing it while replicas are upgraded one by one), with UNLINK,
// which frees a large set in the background.
func (b *Backend) Sweep(ctx context.Context, _ time.Time, limit int) (int, error) {
	if limit <= 0 {
		return 0, nil
	}
	if b.legacyGone.Load() {
		return 0, nil
	}
	return 0, bounded0(b, ctx, func(ctx context.Context) error {
		n, err := b.run(ctx, eval(unlinkLegacyScript, b.legacyIndex)).Int()
		if err == nil && n == 0 {
			b.legacyGone.Store(true)
		}
		return err
	})
}

// unlinkLegacyScript deletes the legacy index only if it is a sorted set:
// a key of the application's own under the same prefix is left alone
// (helper-38: Sweep deleted a hash named <prefix>expiry every minute).
var unlinkLegacyScript = newScript(`if redis.call('TYPE', KEYS[1]).ok == 'zset' then
  return redis.call('UNLINK', KEYS[1])
end
return 0`)

// ExpiresRecords marks the backend as backend.SelfExpiring.
func (*Backend) ExpiresRecords() {}

// Each calls fn for every record under the backend's prefix, stopping at
// fn's first error. It is for inspection (cmd/idem): it SCANs the keyspace,
// every primary's on a Cluster, reads each page of up to 1,000 keys in one
// pipelined round trip, and calls fn from one goroutine at a time.
func (b *Backend) Each(ctx context.Context, fn func(backend.Record) error) error {
	if err := ctx.Err(); err != nil {
		return backend.Refuse(err) // nothing read, as the other methods refuse
	}
	if c, ok := b.rdb.(*redis.ClusterClient); ok {
		var mu sync.Mutex
		return c.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
			return b.each(ctx, node, func(rec backend.Record) error {
				mu.Lock()
				defer mu.Unlock()
				return fn(rec)
			})
		})
	}
	return b.each(ctx, b.rdb, fn)
}

func (b *Backend) each(ctx context.Context, node redis.Cmdable, fn func(backend.Record) error) error {
	match := globEscape(b.prefix+"k:") + "*"
	var cursor uint64
	for {
		keys, next, err := node.Scan(ctx, cursor, match, 1000).Result()
		if err != nil {
			return err
		}
		page, err := b.getPage(ctx, node, keys)
		if err != nil {
			return err
		}
		for _, rec := range page {
			if err := fn(rec); err != nil {
				return err
			}
		}
		if next == 0 {
			return nil
		}
		cursor = next
	}
}

// getPage reads the records of one SCAN page, which are all on node, in
// one round trip: a pipeline of the get script (sent whole, as EVAL: see
// Complete). A key gone since the SCAN is left out.
func (b *Backend) getPage(ctx context.Context, node redis.Cmdable, keys []string) ([]backend.Record, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	cmds := make([]*redis.Cmd, len(keys))
	_, err := node.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, k := range keys {
			cmds[i] = getScript.Eval(ctx, p, []string{k})
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, err
	}
	page := make([]backend.Record, 0, len(keys))
	for i, c := range cmds {
		reply, err := c.Result()
		switch {
		case errors.Is(err, redis.Nil):
			continue
		case err != nil:
			return nil, err
		}
		rec, err := decodeSeen(strings.TrimPrefix(keys[i], b.prefix+"k:"), reply)
		if err != nil {
			return nil, err
		}
		page = append(page, rec)
	}
	return page, nil
}

// globEscape quotes the characters SCAN's MATCH reads as a pattern, so a
// prefix such as "app[1]:" or "a*:" matches itself only: unquoted, the
// listing of one prefix would take in another's keys.
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		switch r {
		case '*', '?', '[', ']', '\\', '^', '-':
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}
