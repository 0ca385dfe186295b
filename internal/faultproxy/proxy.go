// Package faultproxy is a TCP proxy on 127.0.0.1 that tests put between a
// client and a real server (PostgreSQL, Redis, or a fake) to make the network
// fail at the worst moment: lose a reply after the server has executed the
// request, lose a request before the server sees it, or drop every connection
// at once. Tests then check that the code under test neither repeats nor loses
// the work. It is test support only.
package faultproxy

import (
	"bytes"
	"context"
	"errors"
	"net"
	"sync"
	"testing"
)

// MaxMatch is the longest match accepted by DropReply and DropRequest; the
// proxy keeps MaxMatch-1 bytes of each connection's past client traffic so
// that a match split across two reads is still found.
const MaxMatch = 4096

// Proxy forwards connections to one target and injects the armed fault.
// Its methods are safe for concurrent use.
type Proxy struct {
	t      testing.TB
	target string
	ln     net.Listener
	ctx    context.Context // cancelled by Close; bounds dials to target
	cancel context.CancelFunc
	wg     sync.WaitGroup // the accept loop, plus two per proxied connection

	mu     sync.Mutex
	closed bool               // guarded by mu; set once by Close
	pipes  map[*pipe]struct{} // guarded by mu; connections not yet closed by closePipe
	armed  *fault             // guarded by mu; nil when no fault is armed
	fired  chan struct{}      // guarded by mu; fired channel of the latest armed fault
}

// fault is one armed, one-shot fault.
type fault struct {
	match []byte
	done  func(reply []byte) bool // nil for DropRequest
	fired chan struct{}           // closed by the goroutine that cut the connection
}

// pipe is one proxied connection.
type pipe struct {
	client, server net.Conn // set before the pipe is registered, never changed
	// drop is set once, under Proxy.mu, by the request copier when a
	// DropReply fault matches on this pipe; the reply copier reads it.
	drop *fault
}

// Start listens on 127.0.0.1:0 and forwards every accepted connection to
// target. The proxy is closed on t.Cleanup.
func Start(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("faultproxy: listen: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Proxy{t: t, target: target, ln: ln, ctx: ctx, cancel: cancel, pipes: make(map[*pipe]struct{})}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.Close)
	return p
}

// Addr returns the host:port clients should connect to.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// DropReply arms a one-shot fault. The next client-to-server chunk (on any
// connection) whose bytes complete an occurrence of match is forwarded to the
// server; the proxy then stops reading from that client, reads the server's
// reply until done(reply) reports it complete, discards it, and closes both
// sides. The client sees a broken connection although the server did the
// work. The protocol must be request/response on that connection: bytes the
// server sends after the match count as the reply. If the connection is lost
// before the reply is complete (other than by Close), the test fails.
// Arming replaces any fault that has not fired yet.
func (p *Proxy) DropReply(match []byte, done func(reply []byte) bool) {
	if done == nil {
		panic("faultproxy: DropReply with a nil done")
	}
	p.arm(match, done)
}

// DropRequest arms a one-shot fault: the next client-to-server chunk whose
// bytes complete an occurrence of match is not forwarded, and the proxy closes
// both sides of that connection at once, so the server never sees the request
// whole. Arming replaces any fault that has not fired yet.
func (p *Proxy) DropRequest(match []byte) { p.arm(match, nil) }

func (p *Proxy) arm(match []byte, done func([]byte) bool) {
	if len(match) == 0 || len(match) > MaxMatch {
		panic("faultproxy: match must be 1 to MaxMatch bytes")
	}
	f := &fault{match: bytes.Clone(match), done: done, fired: make(chan struct{})}
	p.mu.Lock()
	p.armed, p.fired = f, f.fired
	p.mu.Unlock()
}

// Fired returns a channel closed once the most recently armed fault has fired,
// that is, once its connection has been closed (for DropReply, after the whole
// reply was read). It is nil before any fault is armed.
func (p *Proxy) Fired() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.fired
}

// KillAll closes both sides of every open proxied connection, like a server
// that drops all its clients. New connections are still accepted.
func (p *Proxy) KillAll() {
	p.mu.Lock()
	pipes := make([]*pipe, 0, len(p.pipes))
	for pc := range p.pipes {
		pipes = append(pipes, pc)
	}
	p.mu.Unlock()
	for _, pc := range pipes {
		p.closePipe(pc)
	}
}

// Close closes the listener and every connection, and waits for all the
// proxy's goroutines to return. It is idempotent and called on t.Cleanup.
func (p *Proxy) Close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.cancel()
	p.ln.Close()
	p.KillAll() // no pipe is registered after closed is set
	p.wg.Wait()
}

// AnyReply reports whether reply holds at least one byte. It suits protocols
// with one short reply per request, such as Redis.
func AnyReply(reply []byte) bool { return len(reply) > 0 }

// accept dials target for each accepted client and starts its two copiers.
func (p *Proxy) accept() {
	defer p.wg.Done()
	var d net.Dialer
	for {
		client, err := p.ln.Accept()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				p.t.Errorf("faultproxy: accept: %v", err)
			}
			return
		}
		server, err := d.DialContext(p.ctx, "tcp", p.target)
		if err != nil {
			p.t.Logf("faultproxy: dial %s: %v", p.target, err)
			client.Close()
			continue
		}
		pc := &pipe{client: client, server: server}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			client.Close()
			server.Close()
			return
		}
		p.pipes[pc] = struct{}{}
		p.wg.Add(2)
		p.mu.Unlock()
		go p.copyRequests(pc)
		go p.copyReplies(pc)
	}
}

// closePipe closes both sides of pc and forgets it; later calls do nothing.
func (p *Proxy) closePipe(pc *pipe) {
	p.mu.Lock()
	_, open := p.pipes[pc]
	delete(p.pipes, pc)
	p.mu.Unlock()
	if open {
		pc.client.Close()
		pc.server.Close()
	}
}

// copyRequests forwards client bytes to the server until either side fails
// or a fault fires. After DropReply fires it leaves the pipe open for
// copyReplies to read the reply and close it.
func (p *Proxy) copyRequests(pc *pipe) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	var tail []byte // the last MaxMatch-1 bytes forwarded
	for {
		n, err := pc.client.Read(buf)
		if n > 0 {
			chunk := buf[:n]
			f := p.take(pc, tail, chunk)
			if f != nil && f.done == nil { // DropRequest
				p.closePipe(pc)
				close(f.fired)
				return
			}
			if _, err := pc.server.Write(chunk); err != nil {
				p.closePipe(pc)
				return
			}
			if f != nil { // DropReply
				return
			}
			tail = append(tail, chunk...)
			if len(tail) > MaxMatch-1 {
				tail = append(tail[:0], tail[len(tail)-(MaxMatch-1):]...)
			}
		}
		if err != nil {
			p.closePipe(pc)
			return
		}
	}
}

// take disarms and returns the armed fault if tail+chunk completes its match
// within chunk; for DropReply it also marks pc as dropping its reply.
func (p *Proxy) take(pc *pipe, tail, chunk []byte) *fault {
	p.mu.Lock()
	defer p.mu.Unlock()
	f := p.armed
	if _, open := p.pipes[pc]; f == nil || !open {
		return nil
	}
	k := min(len(tail), len(f.match)-1)
	window := append(append(make([]byte, 0, k+len(chunk)), tail[len(tail)-k:]...), chunk...)
	if !bytes.Contains(window, f.match) {
		return nil
	}
	p.armed = nil
	if f.done != nil {
		pc.drop = f
	}
	return f
}

// copyReplies forwards server bytes to the client until either side fails,
// or, once pc.drop is set, swallows them until the reply is complete and then
// cuts the connection.
func (p *Proxy) copyReplies(pc *pipe) {
	defer p.wg.Done()
	defer p.closePipe(pc)
	buf := make([]byte, 32<<10)
	var reply []byte // the reply to drop, so far
	for {
		n, err := pc.server.Read(buf)
		p.mu.Lock()
		f, closed := pc.drop, p.closed
		p.mu.Unlock()
		if f != nil {
			reply = append(reply, buf[:n]...)
			if n > 0 && f.done(reply) {
				p.closePipe(pc)
				close(f.fired)
				return
			}
		} else if n > 0 {
			if _, err := pc.client.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			if f != nil && !closed {
				p.t.Errorf("faultproxy: connection lost before the dropped reply was complete (%d bytes read): %v", len(reply), err)
			}
			return
		}
	}
}
