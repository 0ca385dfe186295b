package redis

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// A script is a Lua script with its hash and source boxed once, so that
// sending it allocates only its command and arguments.
type script struct {
	*redis.Script
	hash, src any
}

func newScript(src string) *script {
	s := redis.NewScript(src)
	return &script{Script: s, hash: s.Hash(), src: src}
}

// An evalCmd is one call of a script on one key: the command and its
// arguments in a single allocation, where go-redis's Script.Run makes a
// keys slice, an argument slice and a boxed name and hash besides.
type evalCmd struct {
	redis.Cmd
	s    *script
	argv [8]any
	n    int
	// key and blob are the key and the binary record, sent by pointer: a
	// pointer in an interface allocates nothing, a string or a slice
	// does. The key is written into kb, where it fits.
	key, blob rawArg
	kb        [96]byte
}

// A rawArg is bytes go-redis sends as they are (encoding.BinaryMarshaler).
type rawArg []byte

func (r *rawArg) MarshalBinary() ([]byte, error) { return *r, nil }

// String is r as a hook that prints a command's arguments shows it.
func (r *rawArg) String() string { return string(*r) }

// eval starts a call of s on key, by hash. The number of keys is a
// string so that it is not boxed; a Cluster or Ring client reads it, and
// the key after it, to route the command.
func eval(s *script, key string) *evalCmd {
	c := &evalCmd{s: s, n: 4}
	c.argv[0], c.argv[1], c.argv[2], c.argv[3] = "evalsha", s.hash, "1", key
	return c
}

// evalRecord starts a call of s on the record of key k. A client that
// routes commands by key (Cluster, Ring) reads it as a string; a
// single-node client is sent it by pointer, with no allocation of its
// own.
func (b *Backend) evalRecord(s *script, k string) *evalCmd {
	if b.routed {
		return eval(s, b.key(k))
	}
	c := eval(s, "")
	c.key = append(append(append(c.kb[:0], b.prefix...), "k:"...), k...)
	c.argv[3] = &c.key
	return c
}

// arg appends an argument.
func (c *evalCmd) arg(v any) *evalCmd {
	c.argv[c.n] = v
	c.n++
	return c
}

// record appends a binary record.
func (c *evalCmd) record(v []byte) *evalCmd {
	c.blob = v
	return c.arg(&c.blob)
}

// run sends c on the backend's client and returns its command. A script
// the server does not hold (NOSCRIPT: a restarted or flushed server, a
// cold script cache) is sent again whole, as go-redis's Run does.
func (b *Backend) run(ctx context.Context, c *evalCmd) *redis.Cmd {
	cmd := b.send(ctx, c)
	if err := cmd.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		again := &evalCmd{s: c.s, argv: c.argv, n: c.n} // a key or record argument still points into c
		again.argv[0], again.argv[1] = "eval", c.s.src
		cmd = b.send(ctx, again)
	}
	return cmd
}

// send sends c.
func (b *Backend) send(ctx context.Context, c *evalCmd) *redis.Cmd {
	c.Cmd = *redis.NewCmd(ctx, c.argv[:c.n]...)
	c.SetFirstKeyPos(3)
	_ = b.rdb.Process(ctx, &c.Cmd)
	return &c.Cmd
}

// A msArg is a duration in milliseconds, boxed once for as long as the
// calls pass the same one (a Store's lease and TTL stay put): boxing an
// int64 of 256 or more allocates.
type msArg struct{ last atomic.Pointer[msBox] }

type msBox struct {
	d   time.Duration
	arg any
}

// of returns d's milliseconds (millis, at least min), boxed.
func (m *msArg) of(d time.Duration, min int64) any {
	if box := m.last.Load(); box != nil && box.d == d {
		return box.arg
	}
	box := &msBox{d: d, arg: max(millis(d), min)}
	m.last.Store(box)
	return box.arg
}
