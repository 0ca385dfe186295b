package idemgrpc_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemgrpc"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
)

// dropFirstReply lets the first call run, then loses its reply on the way
// back (Unavailable, as a dropped connection gives), and records every
// key it sees.
type dropFirstReply struct {
	mu    sync.Mutex
	keys  []string
	calls int
}

func (d *dropFirstReply) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	d.mu.Lock()
	d.keys = append(d.keys, md.Get(idemgrpc.KeyHeader)...)
	d.calls++
	first := d.calls == 1
	d.mu.Unlock()
	resp, err := handler(ctx, req)
	if first {
		return nil, status.Error(codes.Unavailable, "connection reset (reply lost)")
	}
	return resp, err
}

func TestClientKeepsOneKeyAcrossRetries(t *testing.T) {
	p := &payments{}
	drop := &dropFirstReply{}
	conn := startBuf(t, p,
		[]grpc.UnaryServerInterceptor{drop.intercept, idemgrpc.UnaryServerInterceptor(newStore(t, idem.Options{}), idemgrpc.Options{})},
		idemgrpc.UnaryClientInterceptor(idemgrpc.ClientOptions{MinBackoff: 1, MaxBackoff: 1}))
	out, err := charge(context.Background(), conn, "", 450)
	require.NoError(t, err, "the retry got the answer the first reply lost")
	assert.Equal(t, float64(1), out.Fields["charge"].GetNumberValue())
	assert.Equal(t, int32(1), p.runs.Load(), "the charge ran once")
	require.Len(t, drop.keys, 2)
	assert.NotEmpty(t, drop.keys[0])
	assert.Equal(t, drop.keys[0], drop.keys[1], "one key on every attempt")

	// A second logical call gets a key of its own.
	_, err = charge(context.Background(), conn, "", 450)
	require.NoError(t, err)
	assert.NotEqual(t, drop.keys[0], drop.keys[len(drop.keys)-1])
}

func TestClientKeepsTheCallersKeyAndNeverRetriesInvalidArgument(t *testing.T) {
	p := &payments{}
	var seen []string
	var mu sync.Mutex
	record := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		mu.Lock()
		seen = append(seen, md.Get(idemgrpc.KeyHeader)...)
		mu.Unlock()
		return handler(ctx, req)
	}
	conn := startBuf(t, p,
		[]grpc.UnaryServerInterceptor{record, idemgrpc.UnaryServerInterceptor(newStore(t, idem.Options{}), idemgrpc.Options{})},
		idemgrpc.UnaryClientInterceptor(idemgrpc.ClientOptions{MinBackoff: 1, MaxBackoff: 1}))
	_, err := charge(context.Background(), conn, "order-101", 450)
	require.NoError(t, err)
	_, err = charge(context.Background(), conn, "order-101", 900)
	assert.Equal(t, codes.InvalidArgument, status.Code(err))
	assert.Equal(t, []string{"order-101", "order-101"}, seen, "the caller's key, and no retry of InvalidArgument")
}

// With MaxAttempts 1 the interceptor only adds the key, and gRPC's own
// retry policy resends it. (gRPC retries only before response headers
// arrive, so this handler sets none.)
func TestGRPCRetryPolicyResendsTheKey(t *testing.T) {
	p := &payments{quiet: true}
	drop := &dropFirstReply{}
	conn := startBuf(t, p,
		[]grpc.UnaryServerInterceptor{drop.intercept, idemgrpc.UnaryServerInterceptor(newStore(t, idem.Options{}), idemgrpc.Options{})},
		idemgrpc.UnaryClientInterceptor(idemgrpc.ClientOptions{MaxAttempts: 1}))
	out, err := charge(context.Background(), conn, "", 450)
	require.NoError(t, err, "gRPC retried the lost reply")
	assert.Equal(t, float64(1), out.Fields["charge"].GetNumberValue())
	assert.Equal(t, int32(1), p.runs.Load())
	require.Len(t, drop.keys, 2)
	assert.Equal(t, drop.keys[0], drop.keys[1], "gRPC's retry sent the same key")
}

// The client interceptor retries an Aborted call MaxAttempts times in all,
// with the same key on every attempt.
func TestClientRetryKeepsMaxAttemptsAndOneKey(t *testing.T) {
	var attempts atomic.Int32
	var seen sync.Map
	aborted := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		attempts.Add(1)
		md, _ := metadata.FromIncomingContext(ctx)
		seen.Store(first(md.Get(idemgrpc.KeyHeader)), true)
		st, _ := status.New(codes.Aborted, "in flight").WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(10 * time.Millisecond)})
		return nil, st.Err()
	}
	conn := startDo(t, func(ctx context.Context, in *structpb.Struct) (*structpb.Struct, error) { return in, nil },
		[]grpc.UnaryServerInterceptor{aborted}, idemgrpc.UnaryClientInterceptor(idemgrpc.ClientOptions{MaxAttempts: 3}))
	_, err := callDo(context.Background(), conn, "")
	assert.Equal(t, codes.Aborted, status.Code(err))
	assert.Equal(t, int32(3), attempts.Load())
	n := 0
	seen.Range(func(any, any) bool { n++; return true })
	assert.Equal(t, 1, n, "one key across attempts")
}

// A RetryInfo delay past the caller's deadline cannot succeed: the client
// gives up at once instead of sleeping until the deadline.
func TestClientGivesUpAtOnceOnRetryInfoBeyondDeadline(t *testing.T) {
	aborted := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		st, _ := status.New(codes.Aborted, "in flight").WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(time.Hour)})
		return nil, st.Err()
	}
	conn := startDo(t, func(ctx context.Context, in *structpb.Struct) (*structpb.Struct, error) { return in, nil },
		[]grpc.UnaryServerInterceptor{aborted}, idemgrpc.UnaryClientInterceptor(idemgrpc.ClientOptions{}))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	_, err := callDo(ctx, conn, "")
	el := time.Since(start)
	t.Logf("returned %v after %v", err, el)
	assert.Less(t, el, 2500*time.Millisecond, "a delay past the deadline cannot succeed: give up at once, not at the deadline")
}
