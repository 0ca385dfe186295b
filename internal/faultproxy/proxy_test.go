package faultproxy

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	"github.com/seed094d4201/idem/internal/svctest"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"golang.org/x/sync/errgroup"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(svctest.M(m)) }

// lineServer is a fake server: for every line it receives it records the
// line, then answers "ok:<line>\n". Each ended connection sends on ended.
type lineServer struct {
	ln    net.Listener
	ended chan struct{} // one value per connection that has ended
	wg    sync.WaitGroup

	mu    sync.Mutex
	lines []string // guarded by mu; every line received, in order
}

func startLineServer(t *testing.T) *lineServer {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	s := &lineServer{ln: ln, ended: make(chan struct{}, 100)}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.wg.Add(1)
			go s.serve(c)
		}
	}()
	t.Cleanup(func() { ln.Close(); s.wg.Wait() }) // runs after the proxy's Close
	return s
}

func (s *lineServer) serve(c net.Conn) {
	defer s.wg.Done()
	defer func() { c.Close(); s.ended <- struct{}{} }()
	r := bufio.NewReader(c)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		s.mu.Lock()
		s.lines = append(s.lines, line[:len(line)-1])
		s.mu.Unlock()
		if _, err := io.WriteString(c, "ok:"); err != nil { // replies in two writes
			return
		}
		if _, err := io.WriteString(c, line); err != nil {
			return
		}
	}
}

func (s *lineServer) received() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.lines...)
}

// lineDone reports a line server's reply complete.
func lineDone(reply []byte) bool { return reply[len(reply)-1] == '\n' }

type client struct {
	net.Conn
	r *bufio.Reader
}

// dial connects to addr; the deadline only stops a broken test from hanging.
func dial(t *testing.T, addr string) *client {
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	require.NoError(t, c.SetDeadline(time.Now().Add(10*time.Second)))
	return &client{Conn: c, r: bufio.NewReader(c)}
}

func (c *client) roundTrip(line string) (string, error) {
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		return "", err
	}
	return c.r.ReadString('\n')
}

// requireCut asserts that the proxy closed c without sending it a byte more.
func requireCut(t *testing.T, c *client) {
	t.Helper()
	data, err := io.ReadAll(c.r)
	require.Empty(t, data)
	if ne, ok := err.(net.Error); ok {
		require.False(t, ne.Timeout(), "connection was not cut: %v", err)
	}
}

func waitFired(t *testing.T, p *Proxy) {
	t.Helper()
	select {
	case <-p.Fired():
	case <-time.After(10 * time.Second):
		t.Fatal("fault did not fire")
	}
}

func TestForwardsBothWays(t *testing.T) {
	srv := startLineServer(t)
	p := Start(t, srv.ln.Addr().String())
	var g errgroup.Group
	for i := range 8 {
		c := dial(t, p.Addr())
		g.Go(func() error {
			for j := range 20 {
				line := fmt.Sprintf("c%d-%d", i, j)
				got, err := c.roundTrip(line)
				if err != nil || got != "ok:"+line+"\n" {
					return fmt.Errorf("round trip %q: got %q, %v", line, got, err)
				}
			}
			return nil
		})
	}
	require.NoError(t, g.Wait())
	require.Len(t, srv.received(), 8*20)
}

func TestDropRequestNeverReachesServer(t *testing.T) {
	srv := startLineServer(t)
	p := Start(t, srv.ln.Addr().String())
	p.DropRequest([]byte("secret"))
	c := dial(t, p.Addr())
	got, err := c.roundTrip("hello")
	require.NoError(t, err)
	require.Equal(t, "ok:hello\n", got)
	_, err = io.WriteString(c, "the-secret\n")
	require.NoError(t, err)
	requireCut(t, c)
	waitFired(t, p)
	<-srv.ended // the server's side is closed too, so it has seen all it ever will
	require.Equal(t, []string{"hello"}, srv.received())
}

func TestDropReplyAfterServerExecuted(t *testing.T) {
	srv := startLineServer(t)
	p := Start(t, srv.ln.Addr().String())
	var mu sync.Mutex
	var seen []byte // the reply done last looked at
	p.DropReply([]byte("charge"), func(reply []byte) bool {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen[:0], reply...)
		return lineDone(reply)
	})
	c := dial(t, p.Addr())
	_, err := io.WriteString(c, "charge-42\n")
	require.NoError(t, err)
	requireCut(t, c)
	waitFired(t, p)
	require.Equal(t, []string{"charge-42"}, srv.received())
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, "ok:charge-42\n", string(seen), "the whole reply was read before the cut")
}

func TestFaultIsOneShot(t *testing.T) {
	srv := startLineServer(t)
	p := Start(t, srv.ln.Addr().String())
	p.DropRequest([]byte("boom"))
	c1 := dial(t, p.Addr())
	_, err := io.WriteString(c1, "boom-1\n")
	require.NoError(t, err)
	requireCut(t, c1)
	waitFired(t, p)
	c2 := dial(t, p.Addr())
	got, err := c2.roundTrip("boom-2")
	require.NoError(t, err)
	require.Equal(t, "ok:boom-2\n", got)
	require.Equal(t, []string{"boom-2"}, srv.received())
}

func TestMatchSpanningTwoReads(t *testing.T) {
	srv := startLineServer(t)
	p := Start(t, srv.ln.Addr().String())
	p.DropRequest([]byte("abc\ndef"))
	c := dial(t, p.Addr())
	// The reply proves the proxy read and forwarded the first half on its own.
	got, err := c.roundTrip("one-abc")
	require.NoError(t, err)
	require.Equal(t, "ok:one-abc\n", got)
	_, err = io.WriteString(c, "def-two\n")
	require.NoError(t, err)
	requireCut(t, c)
	waitFired(t, p)
	<-srv.ended
	require.Equal(t, []string{"one-abc"}, srv.received())
}

func TestKillAllAndClose(t *testing.T) {
	srv := startLineServer(t)
	p := Start(t, srv.ln.Addr().String())
	var clients []*client
	for i := range 3 {
		c := dial(t, p.Addr())
		_, err := c.roundTrip(strconv.Itoa(i))
		require.NoError(t, err)
		clients = append(clients, c)
	}
	p.KillAll()
	for _, c := range clients {
		requireCut(t, c)
	}
	c := dial(t, p.Addr())
	got, err := c.roundTrip("after")
	require.NoError(t, err, "a new connection works after KillAll")
	require.Equal(t, "ok:after\n", got)
	p.Close()
	requireCut(t, c)
	p.Close() // idempotent
}

func TestPostgresReadyForQuery(t *testing.T) {
	cmdComplete := []byte("C\x00\x00\x00\x0bINSERT\x00")
	ready := []byte("Z\x00\x00\x00\x05I")
	both := append(append([]byte(nil), cmdComplete...), ready...)
	require.False(t, PostgresReadyForQuery(nil))
	require.False(t, PostgresReadyForQuery(cmdComplete))
	for i := range len(both) {
		require.False(t, PostgresReadyForQuery(both[:i]), "prefix of %d bytes", i)
	}
	require.True(t, PostgresReadyForQuery(both))
	require.False(t, PostgresReadyForQuery([]byte("Z\x00\x00\x00\x02I")), "bad length")
	// A 'Z' byte inside another message's body is not a ReadyForQuery.
	require.False(t, PostgresReadyForQuery([]byte("C\x00\x00\x00\x0eZ\x00\x00\x00\x05I\x00\x00\x00")))
}

func uniqueName(t *testing.T) string {
	b := make([]byte, 8)
	_, err := rand.Read(b)
	require.NoError(t, err)
	return hex.EncodeToString(b)
}

func TestRedisLostReply(t *testing.T) {
	addr := svctest.Redis(t)
	ctx := context.Background()
	direct := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { direct.Close() })
	key := "faultproxy-k-unique-" + uniqueName(t)
	t.Cleanup(func() { direct.Del(ctx, key) })
	p := Start(t, addr)
	proxied := redis.NewClient(&redis.Options{Addr: p.Addr(), MaxRetries: -1})
	t.Cleanup(func() { proxied.Close() })

	p.DropReply([]byte(key), AnyReply)
	require.Error(t, proxied.Set(ctx, key, "v", time.Minute).Err(), "the reply was lost")
	waitFired(t, p)
	got, err := direct.Get(ctx, key).Result()
	require.NoError(t, err)
	require.Equal(t, "v", got, "yet Redis executed the SET")
}

func TestPostgresLostReply(t *testing.T) {
	dsn := svctest.Postgres(t)
	ctx := context.Background()
	cfg, err := pgx.ParseConfig(dsn)
	require.NoError(t, err)
	if cfg.TLSConfig != nil {
		svctest.Skipf(t, "IDEM_POSTGRES_DSN must use sslmode=disable so the proxy can see the SQL")
	}
	direct, err := pgx.ConnectConfig(ctx, cfg.Copy())
	require.NoError(t, err)
	t.Cleanup(func() { direct.Close(ctx) })
	table := "faultproxy_" + uniqueName(t)
	_, err = direct.Exec(ctx, "CREATE TABLE "+table+" (v text)")
	require.NoError(t, err)
	t.Cleanup(func() { direct.Exec(ctx, "DROP TABLE "+table) })

	p := Start(t, net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))))
	proxyAddr := p.ln.Addr().(*net.TCPAddr)
	cfg.Host, cfg.Port, cfg.Fallbacks = proxyAddr.IP.String(), uint16(proxyAddr.Port), nil
	proxied, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { proxied.Close(ctx) })

	insert := "INSERT INTO " + table + " (v) VALUES ('lost-reply')"
	p.DropReply([]byte(insert), PostgresReadyForQuery)
	_, err = proxied.Exec(ctx, insert) // no arguments: one simple-protocol Query message
	require.Error(t, err, "the reply was lost")
	waitFired(t, p)
	var n int
	require.NoError(t, direct.QueryRow(ctx, "SELECT count(*) FROM "+table+" WHERE v = 'lost-reply'").Scan(&n))
	require.Equal(t, 1, n, "yet PostgreSQL committed the INSERT")
}

// packet frames payload as one MySQL packet.
func packet(seq byte, payload ...byte) []byte {
	n := len(payload)
	return append([]byte{byte(n), byte(n >> 8), byte(n >> 16), seq}, payload...)
}

func TestMySQLReplyDone(t *testing.T) {
	ok := packet(1, 0x00, 0x01, 0x00, 0x02, 0x00, 0x00, 0x00)
	errp := packet(1, append([]byte{0xFF, 0x15, 0x04, '#'}, "28000denied"...)...)
	col := packet(2, append([]byte{0x03}, "def"...)...)
	eof := packet(3, 0xFE, 0x00, 0x00, 0x02, 0x00)
	row := packet(4, 0x01, 'x')
	rowFE := packet(4, 0xFE, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10) // a row whose first value is long
	okEnd := packet(5, 0xFE, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00)
	cat := func(ps ...[]byte) []byte {
		var b []byte
		for _, p := range ps {
			b = append(b, p...)
		}
		return b
	}
	for name, whole := range map[string][]byte{
		"ok":                      ok,
		"err":                     errp,
		"rows with EOFs":          cat(packet(1, 0x01), col, eof, row, rowFE, eof),
		"no rows with EOFs":       cat(packet(1, 0x01), col, eof, eof),
		"rows, deprecated EOF":    cat(packet(1, 0x01), col, row, okEnd),
		"no rows, deprecated EOF": cat(packet(1, 0x01), col, okEnd),
		"error among the rows":    cat(packet(1, 0x01), col, eof, row, errp),
	} {
		for i := range len(whole) {
			require.False(t, MySQLReplyDone(whole[:i]), "%s: prefix of %d bytes", name, i)
		}
		require.True(t, MySQLReplyDone(whole), name)
	}
	// A payload of 0xFFFFFF bytes goes on in the next packet: an 0xFF
	// there is data, not an ERR.
	big := make([]byte, 0xFFFFFF)
	split := cat(packet(1, 0x01), col, eof, packet(4, big...), packet(5, 0xFF, 0x00), eof)
	require.False(t, MySQLReplyDone(split[:len(split)-len(eof)]))
	require.True(t, MySQLReplyDone(split))
}
