package idemgrpc_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemgrpc"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// A handler's final answer may carry a retryable code (a payment provider
// that says, for good, that it is unavailable for this order). Once the
// server remembers it, every retry with the key meets the same replay: the
// client stops at the first replayed answer rather than spend its attempts
// on it.
func TestClientStopsRetryingAtAReplayedAnswer(t *testing.T) {
	p := &payments{fail: func(int32) error {
		return idem.Final(status.Error(codes.Unavailable, "provider closed this order"))
	}}
	var calls atomic.Int32
	count := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		calls.Add(1)
		return handler(ctx, req)
	}
	conn := startBuf(t, p,
		[]grpc.UnaryServerInterceptor{count, idemgrpc.UnaryServerInterceptor(newStore(t, idem.Options{}), idemgrpc.Options{})},
		idemgrpc.UnaryClientInterceptor(idemgrpc.ClientOptions{MaxAttempts: 4, MinBackoff: 1, MaxBackoff: 1}))

	_, err := charge(context.Background(), conn, "order-7", 450)
	require.Error(t, err)
	assert.Equal(t, codes.Unavailable, status.Code(err), "the remembered answer")
	assert.Equal(t, int32(1), p.runs.Load(), "the handler ran once")
	// The connection's own retry policy (helpers_test.go) resends the
	// first answer, trailers-only and unmarked, and meets the replay; the
	// interceptor, seeing it marked, sends no more (it made 5 calls so).
	assert.Equal(t, int32(2), calls.Load(), "the first answer, then one retry that met its replay; not MaxAttempts more")
}

// An Unavailable that is no replay (the store could not be reached, a
// reply lost) is still retried up to MaxAttempts.
func TestClientRetriesAnUnavailableThatIsNoReplay(t *testing.T) {
	p := &payments{}
	down := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		return nil, status.Error(codes.Unavailable, "down")
	}
	var attempts atomic.Int32 // the interceptor's, each of which the connection's own retry policy may resend
	count := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		attempts.Add(1)
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	conn := startBuf(t, p, []grpc.UnaryServerInterceptor{down},
		idemgrpc.UnaryClientInterceptor(idemgrpc.ClientOptions{MaxAttempts: 4, MinBackoff: 1, MaxBackoff: 1}), count)
	_, err := charge(context.Background(), conn, "order-8", 450)
	assert.Equal(t, codes.Unavailable, status.Code(err))
	assert.Equal(t, int32(4), attempts.Load())
}
