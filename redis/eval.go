package redis

import (
	"context"
	"fmt"
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
	key, blob, tok rawArg
	kb             [96]byte
	tb             [40]byte

	// What call hands the goroutine that sends the command (see call),
	// and what that goroutine hands back: the command it ended with, or,
	// if the client panicked or ended the goroutine, err. done is closed
	// once they are written.
	b    *Backend
	ctx  context.Context
	res  *redis.Cmd
	err  error
	done chan struct{}
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

// token appends a claim's token, copied into c where it fits, so that it
// is not boxed (a string in an interface allocates).
func (c *evalCmd) token(t string) *evalCmd {
	if len(t) > len(c.tb) {
		return c.arg(t)
	}
	c.tok = append(c.tb[:0], t...)
	return c.arg(&c.tok)
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
	cmd := b.sendCmd(ctx, c)
	if err := cmd.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		again := &evalCmd{s: c.s, argv: c.argv, n: c.n} // a key or record argument still points into c
		again.argv[0], again.argv[1] = "eval", c.s.src
		cmd = b.sendCmd(ctx, again)
	}
	return cmd
}

// call sends c under ctx and returns its command, or ctx's error once
// ctx ends: bounded, for one script call, with no closure nor generic
// answer to allocate. A call whose ctx can end is waited on from a
// goroutine of its own, which the caller leaves when ctx ends; one whose
// ctx can never end runs in the caller's goroutine; one whose ctx had
// ended is refused, nothing sent. A command that came back with an error
// (the server's, or the client's) returns it as its error too.
func (b *Backend) call(ctx context.Context, c *evalCmd) (*redis.Cmd, error) {
	direct, err := b.direct(ctx)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	if direct {
		cmd := b.run(ctx, c)
		return cmd, b.after(ctx, start, cmd.Err())
	}
	c.b, c.ctx, c.done = b, ctx, make(chan struct{})
	b.senders.hand(c)
	select {
	case <-c.done:
	case <-ctx.Done():
		select {
		case <-c.done: // an answer that came with the end is kept
		default:
			// c is the goroutine's from here on: the command goes on
			// until the client answers or gives up.
			return nil, unreachable(ctx, b.dials, start, fmt.Errorf("redis: no answer before ctx ended: %w", ctx.Err()))
		}
	}
	if c.err != nil {
		return nil, unreachable(ctx, b.dials, start, c.err)
	}
	return c.res, unreachable(ctx, b.dials, start, c.res.Err())
}

// senders are the goroutines that call's commands are sent from. One that
// has sent a command waits a while (senderIdle) for the next before it
// ends, so that a call seldom starts a goroutine, nor grows a new
// goroutine's stack to the depth go-redis's sending takes (copying the
// stack was an eighth of a new key's CPU at one caller, by profile).
type senders struct {
	next chan *evalCmd
	live atomic.Int32 // how many run
}

// senderIdle is how long a sender waits for its next command before it
// ends: no goroutine of the backend outlives its last call by more.
const senderIdle = 50 * time.Millisecond

// hand gives c to a sender that waits for one, or to a new one.
func (s *senders) hand(c *evalCmd) {
	select {
	case s.next <- c:
	default:
		go s.run(c)
	}
}

// run sends c, and the commands handed to it after, until none comes for
// senderIdle (or the client ends the goroutine: see send).
func (s *senders) run(c *evalCmd) {
	s.live.Add(1)
	defer s.live.Add(-1)
	var idle *time.Timer
	for {
		c.send()
		if idle == nil {
			idle = time.NewTimer(senderIdle)
		} else {
			idle.Reset(senderIdle)
		}
		select {
		case c = <-s.next:
		case <-idle.C:
			return
		}
	}
}

// send sends c from a sender, and closes c.done once its answer is
// written. No caller may be left to take a panic (a client's
// hook, say) from it, which would end the process; a hook that ends it
// (runtime.Goexit) gave no answer either.
func (c *evalCmd) send() {
	returned := false
	defer func() {
		if p := recover(); p != nil {
			c.err = fmt.Errorf("redis: panic in the client: %v", p)
		} else if !returned {
			c.err = errClientExited
		}
		close(c.done)
	}()
	c.res = c.b.run(c.ctx, c)
	returned = true
}

// sendCmd sends c.
func (b *Backend) sendCmd(ctx context.Context, c *evalCmd) *redis.Cmd {
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
