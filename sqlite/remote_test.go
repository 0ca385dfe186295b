package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"net/rpc"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/seed094d4201/idem/backend"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A Backend in another process: the child mode "serve" runs the Backend's
// methods for its parent over net/rpc on a unix socket, and remote is the
// parent's backend.Backend that sends its calls there. The tests in
// multiproc_test.go use them to put several processes on one SQLite file.

const socketEnv = "IDEM_SQLITE_SOCKET"

func init() {
	// serve: listens on the socket socketEnv names, says "ready", serves
	// one connection, its parent's, and exits when the parent closes it.
	childModes["serve"] = serveChild
}

// WireCall is one call sent to a child; each Op uses some of the fields.
// net/rpc wants it exported.
type WireCall struct {
	File       string // the database file: the child opens it on first use
	Op         string // a Backend method's name, or "open", "close", "claimAll"
	Rec        backend.Record
	Key, Token string
	Now        time.Time
	D          time.Duration // the lease or TTL
	Limit      int
	Keys       []string  // claimAll: the keys to claim, all at once, with tokens Token+"/"+key
	Deadline   time.Time // the caller's ctx deadline, zero for none: a ctx cannot cross the wire
}

// WireReply is a call's result, and its error as a kind and a message.
type WireReply struct {
	Rec    backend.Record
	OK     bool
	N      int
	Won    []bool   // claimAll: whether this process won each key
	Tokens []string // claimAll: the token of the record each claim saw
	Kind   int      // 0 no error, i+1 sentinels[i], -1 any other error
	Msg    string
}

// sentinels are the errors whose identity crosses the wire, so that
// errors.Is works on a child's errors as on the local Backend's.
var sentinels = []error{backend.ErrNotOwner, backend.ErrInProgress, backend.ErrClosed, context.Canceled, context.DeadlineExceeded}

func toWire(err error) (kind int, msg string) {
	if err == nil {
		return 0, ""
	}
	for i, s := range sentinels {
		if errors.Is(err, s) {
			return i + 1, err.Error()
		}
	}
	return -1, err.Error()
}

func fromWire(kind int, msg string) error {
	switch {
	case kind == 0:
		return nil
	case kind > 0 && kind <= len(sentinels):
		return fmt.Errorf("%w: %s", sentinels[kind-1], msg)
	}
	return errors.New(msg)
}

// server is the child's side: one Backend per file, opened on demand.
type server struct {
	mu  sync.Mutex
	dbs map[string]*sql.DB
	bs  map[string]*Backend
}

func serveChild() error {
	l, err := net.Listen("unix", os.Getenv(socketEnv))
	if err != nil {
		return err
	}
	s := &server{dbs: map[string]*sql.DB{}, bs: map[string]*Backend{}}
	srv := rpc.NewServer()
	if err := srv.RegisterName("Backend", s); err != nil {
		return err
	}
	fmt.Println("ready")
	conn, err := l.Accept()
	_ = l.Close()
	if err != nil {
		return err
	}
	srv.ServeConn(conn) // each call in its own goroutine, until the parent hangs up
	var errs []error
	for file := range s.dbs {
		errs = append(errs, s.close(file))
	}
	return errors.Join(errs...)
}

// open returns file's Backend, opening the file (Open and New) the first
// time; the lock makes concurrent first calls open it once.
func (s *server) open(file string) (*Backend, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if b, ok := s.bs[file]; ok {
		return b, nil
	}
	db, err := Open(file)
	if err != nil {
		return nil, err
	}
	b, err := New(context.Background(), db, Options{})
	if err != nil {
		return nil, errors.Join(err, db.Close())
	}
	s.dbs[file], s.bs[file] = db, b
	return b, nil
}

func (s *server) close(file string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	db := s.dbs[file]
	delete(s.dbs, file)
	delete(s.bs, file)
	if db == nil {
		return nil
	}
	return db.Close()
}

// Do runs call; its error travels in reply, since net/rpc would send only
// the message.
func (s *server) Do(call WireCall, reply *WireReply) error {
	ctx := context.Background()
	if !call.Deadline.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, call.Deadline)
		defer cancel()
	}
	reply.Kind, reply.Msg = toWire(s.do(ctx, call, reply))
	return nil
}

func (s *server) do(ctx context.Context, c WireCall, r *WireReply) error {
	if c.Op == "close" {
		return s.close(c.File)
	}
	b, err := s.open(c.File)
	if err != nil {
		return err
	}
	switch c.Op {
	case "open":
	case "Claim":
		r.Rec, r.OK, err = b.Claim(ctx, c.Rec, c.Now, c.D)
	case "Complete":
		err = b.Complete(ctx, c.Rec, c.Now, c.D)
	case "Release":
		err = b.Release(ctx, c.Key, c.Token)
	case "Renew":
		err = b.Renew(ctx, c.Key, c.Token, c.Now, c.D)
	case "Get":
		r.Rec, r.OK, err = b.Get(ctx, c.Key, c.Now)
	case "Forget":
		err = b.Forget(ctx, c.Key, c.Now)
	case "Sweep":
		r.N, err = b.Sweep(ctx, c.Now, c.Limit)
	case "claimAll":
		err = claimAll(ctx, b, c.Keys, c.Token, r)
	default:
		err = fmt.Errorf("unknown op %q", c.Op)
	}
	return err
}

// claimAll claims every key at once, one goroutine each: each claim's read
// finds the key free before most writes land, so that the processes'
// inserts of a key meet under SQLite's lock rather than one process
// finding the others' records.
func claimAll(ctx context.Context, b *Backend, keys []string, token string, r *WireReply) error {
	r.Won, r.Tokens = make([]bool, len(keys)), make([]string, len(keys))
	errs := make([]error, len(keys))
	var wg sync.WaitGroup
	for i, key := range keys {
		wg.Go(func() {
			req := backend.Record{Key: key, Token: token + "/" + key, State: backend.StatePending}
			var got backend.Record
			got, r.Won[i], errs[i] = b.Claim(ctx, req, time.Now(), time.Minute)
			r.Tokens[i] = got.Token
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// startServers starts n "serve" children and connects to each. When the
// test ends it hangs up and requires that every child, having closed its
// files, exited cleanly.
func startServers(t *testing.T, n int) []*rpc.Client {
	t.Helper()
	dir := t.TempDir() // removed after the children exit: cleanups run last in, first out
	clients := make([]*rpc.Client, n)
	for i := range clients {
		sock := filepath.Join(dir, fmt.Sprint(i, ".sock"))
		cmd := startChild(t, "serve", socketEnv+"="+sock)
		c, err := rpc.Dial("unix", sock)
		require.NoError(t, err)
		t.Cleanup(func() {
			assert.NoError(t, c.Close())
			assert.NoError(t, cmd.Wait(), "serve child %d failed", i)
		})
		clients[i] = c
	}
	return clients
}

// remote is a backend.Backend whose calls run in the child behind c, on
// file.
type remote struct {
	c    *rpc.Client
	file string
}

var _ backend.Backend = remote{}

func (r remote) call(ctx context.Context, c WireCall) (WireReply, error) {
	c.File = r.file
	c.Deadline, _ = ctx.Deadline()
	reply := new(WireReply)
	select {
	case done := <-r.c.Go("Backend.Do", c, reply, make(chan *rpc.Call, 1)).Done:
		if done.Error != nil {
			return WireReply{}, done.Error
		}
		return *reply, fromWire(reply.Kind, reply.Msg)
	case <-ctx.Done():
		// As over a network: the call may still land, its reply lost.
		return WireReply{}, ctx.Err()
	}
}

// open makes the child open the file now (Open and New), if it has not.
func (r remote) open() error {
	_, err := r.call(context.Background(), WireCall{Op: "open"})
	return err
}

// close makes the child close the file.
func (r remote) close() error {
	_, err := r.call(context.Background(), WireCall{Op: "close"})
	return err
}

func (r remote) Claim(ctx context.Context, rec backend.Record, now time.Time, lease time.Duration) (backend.Record, bool, error) {
	rep, err := r.call(ctx, WireCall{Op: "Claim", Rec: rec, Now: now, D: lease})
	return rep.Rec, rep.OK, err
}

func (r remote) Complete(ctx context.Context, rec backend.Record, now time.Time, ttl time.Duration) error {
	_, err := r.call(ctx, WireCall{Op: "Complete", Rec: rec, Now: now, D: ttl})
	return err
}

func (r remote) Release(ctx context.Context, key, token string) error {
	_, err := r.call(ctx, WireCall{Op: "Release", Key: key, Token: token})
	return err
}

func (r remote) Renew(ctx context.Context, key, token string, now time.Time, lease time.Duration) error {
	_, err := r.call(ctx, WireCall{Op: "Renew", Key: key, Token: token, Now: now, D: lease})
	return err
}

func (r remote) Get(ctx context.Context, key string, now time.Time) (backend.Record, bool, error) {
	rep, err := r.call(ctx, WireCall{Op: "Get", Key: key, Now: now})
	return rep.Rec, rep.OK, err
}

func (r remote) Forget(ctx context.Context, key string, now time.Time) error {
	_, err := r.call(ctx, WireCall{Op: "Forget", Key: key, Now: now})
	return err
}

func (r remote) Sweep(ctx context.Context, now time.Time, limit int) (int, error) {
	rep, err := r.call(ctx, WireCall{Op: "Sweep", Now: now, Limit: limit})
	return rep.N, err
}
