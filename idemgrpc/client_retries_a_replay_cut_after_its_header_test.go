package idemgrpc_test

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemgrpc"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/test/bufconn"
)

// A replay's headers, mark and all, may reach the client and its
// connection drop before the status does: the client then reads
// Unavailable from its own transport, which is no answer of the server's,
// let alone the key's remembered outcome (a success here). The
// interceptor retries it, as it would any lost reply, and gets the replay
// whole.
func TestClientRetriesAReplayWhoseConnectionDropsAfterItsHeader(t *testing.T) {
	lis := &recordingListener{Listener: bufconn.Listen(1 << 20)}
	headerIn := make(chan struct{}, 1) // the client read a replay's headers
	var calls atomic.Int32
	cut := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		call := calls.Add(1)
		resp, err := handler(ctx, req)
		if call != 2 { // the first runs the handler; the second, a replay, is cut
			return resp, err
		}
		assert.NoError(t, grpc.SendHeader(ctx, nil)) // the replay's headers, marked, go out
		<-headerIn
		lis.closeAll() // the connection drops before the message and the status
		return resp, err
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(cut, idemgrpc.UnaryServerInterceptor(newStore(t, idem.Options{}), idemgrpc.Options{})))
	srv.RegisterService(&serviceDesc, &payments{})
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			return lis.Listener.(*bufconn.Listener).DialContext(ctx)
		}),
		grpc.WithStatsHandler(headerSeen{headerIn}),
		grpc.WithChainUnaryInterceptor(idemgrpc.UnaryClientInterceptor(idemgrpc.ClientOptions{MaxAttempts: 4, MinBackoff: 1, MaxBackoff: 1})))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })

	first, err := charge(context.Background(), conn, "order-9", 450, grpc.WaitForReady(true))
	require.NoError(t, err)
	again, err := charge(context.Background(), conn, "order-9", 450, grpc.WaitForReady(true))
	require.NoError(t, err, "the replay lost in transit is fetched again (%v)", codes.Unavailable)
	assert.Equal(t, first.AsMap(), again.AsMap())
	assert.Equal(t, int32(3), calls.Load(), "the replay's call, sent again once")
}

// headerSeen signals, on the client, the arrival of headers that mark a
// replay.
type headerSeen struct{ in chan struct{} }

func (h headerSeen) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }
func (h headerSeen) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return ctx
}
func (h headerSeen) HandleConn(context.Context, stats.ConnStats) {}
func (h headerSeen) HandleRPC(_ context.Context, s stats.RPCStats) {
	if in, ok := s.(*stats.InHeader); ok && len(metadata.MD(in.Header).Get(idemgrpc.ReplayedHeader)) > 0 {
		select {
		case h.in <- struct{}{}:
		default:
		}
	}
}

// recordingListener keeps the server's connections, so that a test can
// drop them.
type recordingListener struct {
	net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func (l *recordingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.mu.Lock()
		l.conns = append(l.conns, c)
		l.mu.Unlock()
	}
	return c, err
}

func (l *recordingListener) closeAll() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.conns {
		c.Close()
	}
	l.conns = nil
}
