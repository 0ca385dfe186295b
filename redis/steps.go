package redis

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/seed094d4201/idem/backend"
)

var _ backend.Stepper = (*Backend)(nil)

var (
	// KEYS[1] key. Returns {value, the server's TIME: seconds,
	// microseconds}, or nil if the key has no record.
	readScript = newScript(`local v = redis.call('GET', KEYS[1])
if not v then return nil end
local t = redis.call('TIME')
return {v, t[1], t[2]}`)

	// KEYS[1] key; ARGV[1] the value the caller read, ARGV[2] token,
	// ARGV[3] the value to write. Returns 0 if the token does not hold a
	// pending claim whose lease holds, -1 if it does but the value changed
	// since it was read (a Renew, another step), else writes and returns 1.
	// A pending record has no expiry, as Claim leaves it.
	stepScript = newScript(luaNow + `
local v = redis.call('GET', KEYS[1])
if not v then return 0 end
local st, lease, tok = string.match(v, '^(%d)|(%d*)|([^|]*)|')
if tok ~= ARGV[2] or st ~= '1' then return 0 end
if lease ~= '0' and tonumber(lease) <= now then return 0 end
if v ~= ARGV[1] then return -1 end
redis.call('SET', KEYS[1], ARGV[3])
return 1`)

	// KEYS[1] key; ARGV[1] old token, ARGV[2] new token, ARGV[3] lease
	// (ms). Takes over a record that ARGV[1] holds and that is interrupted
	// (its lease lapsed), keeping the rest of the value (created, the
	// record, its steps) as Renew does, and returns the new value; else 0.
	// A repeat of a Resume that landed (a retry after a lost reply) finds
	// its own live claim and returns it, as Claim does. The record has no
	// expiry, as a claim's.
	resumeScript = newScript(luaNow + `
local v = redis.call('GET', KEYS[1])
if not v then return 0 end
local _, e, st, lease, tok = string.find(v, '^(%d)|(%d*)|([^|]*)|')
local lapsed = st == '1' and lease ~= '0' and tonumber(lease) <= now
if tok == ARGV[2] and st == '1' and not lapsed then return v end
if tok ~= ARGV[1] or not (lapsed or st == '3') then return 0 end
local held = 0
if tonumber(ARGV[3]) > 0 then held = now + ARGV[3] end
v = '1|' .. held .. '|' .. ARGV[2] .. '|' .. string.sub(v, e + 1)
redis.call('SET', KEYS[1], v)
return v`)
)

// RecordStep records step under key's claim held by token, its At the
// server's time. The steps are encoded here, not in Lua, so it reads the
// value and writes it back by compare-and-set, the script checking the
// token and the lease by the server's clock; a value changed in between by
// the owner itself (a Renew, a concurrent step) is read again. now is
// ignored.
func (b *Backend) RecordStep(ctx context.Context, key, token string, step backend.Step, _ time.Time) error {
	return bounded0(b, ctx, func(ctx context.Context) error { return b.recordStep(ctx, key, token, step) })
}

func (b *Backend) recordStep(ctx context.Context, key, token string, step backend.Step) error {
	for {
		reply, err := b.run(ctx, b.evalRecord(readScript, key)).Result()
		switch {
		case errors.Is(err, redis.Nil):
			return fmt.Errorf("%w: key %q has no record", backend.ErrNotOwner, key)
		case err != nil:
			return err
		}
		old, now, err := readReply(key, reply)
		if err != nil {
			return err
		}
		val, err := parseValue(key, old)
		if err != nil {
			return err
		}
		rec, err := decode(key, old, -1, false)
		if err != nil {
			return err
		}
		if !rec.HeldBy(token, now) {
			return fmt.Errorf("%w: key %q is %s, its lease until %v", backend.ErrNotOwner, key, rec.State, rec.LeaseUntil)
		}
		if val.created == "" {
			// A value from before the created field: the steps' length
			// field must not be taken for it.
			val.created = strconv.FormatInt(max(rec.CreatedAt.UnixMilli(), 0), 10)
		}
		step.At = now
		val.steps = string(backend.AppendSteps(nil, rec.WithStep(step).Steps))
		n, err := b.run(ctx, b.evalRecord(stepScript, key).arg(old).arg(token).arg(val.String())).Int64()
		switch {
		case err != nil:
			return err
		case n == 0:
			return fmt.Errorf("%w: key %q", backend.ErrNotOwner, key)
		case n == 1:
			return nil
		}
	}
}

// readReply decodes readScript's {value, seconds, microseconds} reply.
func readReply(key string, reply any) (string, time.Time, error) {
	s, ok := reply.([]any)
	if ok && len(s) == 3 {
		v, _ := s[0].(string)
		sec, _ := s[1].(string)
		usec, _ := s[2].(string)
		secs, err1 := strconv.ParseInt(sec, 10, 64)
		usecs, err2 := strconv.ParseInt(usec, 10, 64)
		if err1 == nil && err2 == nil {
			return v, time.Unix(secs, usecs*int64(time.Microsecond)), nil
		}
	}
	return "", time.Time{}, fmt.Errorf("redis: record %q: unexpected reply %v", key, reply)
}

// Resume takes over key's interrupted record held by old, with a lease
// after the server's now; now is ignored.
func (b *Backend) Resume(ctx context.Context, key, old, token string, _ time.Time, lease time.Duration) (backend.Record, error) {
	return bounded(b, ctx, func(ctx context.Context) (backend.Record, error) { return b.resume(ctx, key, old, token, lease) })
}

func (b *Backend) resume(ctx context.Context, key, old, token string, lease time.Duration) (backend.Record, error) {
	if strings.ContainsRune(token, '|') {
		return backend.Record{}, fmt.Errorf("redis: token %q holds '|', which the record header reserves", token)
	}
	reply, err := b.run(ctx, b.evalRecord(resumeScript, key).arg(old).arg(token).arg(millis(lease))).Result()
	if err != nil {
		return backend.Record{}, err
	}
	v, ok := reply.(string)
	if !ok {
		return backend.Record{}, fmt.Errorf("%w: key %q is not interrupted under that token", backend.ErrNotOwner, key)
	}
	return decode(key, v, -1, false)
}
