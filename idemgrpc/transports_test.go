package idemgrpc_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemgrpc"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"
)

// WithKey on a ctx that carries a key already replaces it, as
// idemhttp.WithKey does: the server sees one key, the last one given.
func TestWithKeyReplaces(t *testing.T) {
	var seen []string
	record := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		seen = md.Get(idemgrpc.KeyHeader)
		return handler(ctx, req)
	}
	p := &payments{}
	conn := startBuf(t, p, []grpc.UnaryServerInterceptor{record, idemgrpc.UnaryServerInterceptor(newStore(t, idem.Options{}), idemgrpc.Options{})})
	ctx := idemgrpc.WithKey(context.Background(), "first")
	ctx = metadata.AppendToOutgoingContext(ctx, "tenant", "a")
	_, err := charge(ctx, conn, "second", 1) // charge calls WithKey again
	require.NoError(t, err)
	assert.Equal(t, []string{"second"}, seen)
	md, _ := metadata.FromOutgoingContext(idemgrpc.WithKey(ctx, "third"))
	assert.Equal(t, []string{"third"}, md.Get(idemgrpc.KeyHeader))
	assert.Equal(t, []string{"a"}, md.Get("tenant"), "the rest of the metadata stays")
}

// The handler runs under the caller's deadline, not its cancellation: a
// downstream call made with its context is bounded, and a hung one ends
// with the deadline, releasing the key.
func TestHandlerKeepsTheCallersDeadline(t *testing.T) {
	deadlines := make(chan time.Time, 2)
	handler := func(ctx context.Context, req any) (any, error) {
		d, ok := ctx.Deadline()
		if !ok {
			deadlines <- time.Time{}
			return structpb.NewStruct(map[string]any{"charge": 1.0})
		}
		deadlines <- d
		<-ctx.Done() // a downstream call that never answers
		return nil, ctx.Err()
	}
	intercept := idemgrpc.UnaryServerInterceptor(newStore(t, idem.Options{}), idemgrpc.Options{})
	in, _ := structpb.NewStruct(map[string]any{"amount": 1.0})
	info := &grpc.UnaryServerInfo{FullMethod: chargeMethod}
	want := time.Now().Add(200 * time.Millisecond)
	ctx, cancel := context.WithDeadline(metadata.NewIncomingContext(context.Background(), metadata.Pairs(idemgrpc.KeyHeader, "k")), want)
	defer cancel()
	_, err := intercept(ctx, in, info, handler)
	require.Error(t, err)
	got := <-deadlines
	require.False(t, got.IsZero(), "the handler ran without the caller's deadline")
	assert.True(t, got.Equal(want), "the caller's deadline itself: got %v, want %v", got, want)

	// The key was released: a retry runs the handler again.
	ctx2 := metadata.NewIncomingContext(context.Background(), metadata.Pairs(idemgrpc.KeyHeader, "k"))
	_, err = intercept(ctx2, in, info, handler)
	require.NoError(t, err)
	assert.True(t, (<-deadlines).IsZero(), "a caller with no deadline gives the handler none")
}

// A replay's message is the handler's, field for field, and each caller's
// own: changing one changes no later replay.
func TestReplayIsAPrivateDecodedCopy(t *testing.T) {
	intercept := idemgrpc.UnaryServerInterceptor(newStore(t, idem.Options{}), idemgrpc.Options{})
	in, _ := structpb.NewStruct(map[string]any{"amount": 1.0})
	info := &grpc.UnaryServerInfo{FullMethod: chargeMethod}
	handler := func(ctx context.Context, req any) (any, error) {
		return structpb.NewStruct(map[string]any{"card": "4242"})
	}
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs(idemgrpc.KeyHeader, "k"))
	first, err := intercept(ctx, in, info, handler)
	require.NoError(t, err)
	delete(first.(*structpb.Struct).Fields, "card") // an outer interceptor redacts the first answer
	for range 2 {
		again, err := intercept(ctx, in, info, handler)
		require.NoError(t, err)
		s := again.(*structpb.Struct)
		assert.Equal(t, "4242", s.Fields["card"].GetStringValue())
		s.Fields["card"] = structpb.NewStringValue("redacted")
	}
}

// A header set after the headers were sent is refused by gRPC (the first
// caller never gets it), but the recorder keeps it: the replay is not the
// first answer.
func TestHeaderRefusedByGRPCIsNotReplayed(t *testing.T) {
	var setErr error
	conn := startDo(t, func(ctx context.Context, in *structpb.Struct) (*structpb.Struct, error) {
		_ = grpc.SendHeader(ctx, metadata.Pairs("charge-id", "ch_1"))
		setErr = grpc.SetHeader(ctx, metadata.Pairs("late", "never-sent"))
		return in, nil
	}, []grpc.UnaryServerInterceptor{idemgrpc.UnaryServerInterceptor(newStore(t, idem.Options{}), idemgrpc.Options{Unscoped: true})})
	var h1, h2 metadata.MD
	_, err := callDo(context.Background(), conn, "k", grpc.Header(&h1))
	require.NoError(t, err)
	require.Error(t, setErr, "gRPC refuses a header after SendHeader")
	_, err = callDo(context.Background(), conn, "k", grpc.Header(&h2))
	require.NoError(t, err)
	require.Equal(t, []string{"true"}, h2.Get(idemgrpc.ReplayedHeader))
	assert.Equal(t, h1.Get("late"), h2.Get("late"), "the replay carries a header the first caller never got")
}

// Caller A (deadline 100ms) claims the key; duplicate B (deadline 5s)
// coalesces onto A's execution. B, with plenty of time left, does not get
// A's deadline failure: the work is not bounded by A's deadline alone.
func TestCoalescedDuplicateOutlivesTheFirstCallersDeadline(t *testing.T) {
	var runs atomic.Int32
	handler := func(ctx context.Context, req any) (any, error) {
		runs.Add(1)
		select {
		case <-time.After(300 * time.Millisecond):
			return structpb.NewStruct(map[string]any{"charge": 1.0})
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	intercept := idemgrpc.UnaryServerInterceptor(newStore(t, idem.Options{}), idemgrpc.Options{Wait: 5 * time.Second})
	in, _ := structpb.NewStruct(map[string]any{"amount": 1.0})
	info := &grpc.UnaryServerInfo{FullMethod: chargeMethod}
	md := metadata.Pairs(idemgrpc.KeyHeader, "k")
	actx, acancel := context.WithTimeout(metadata.NewIncomingContext(context.Background(), md), 100*time.Millisecond)
	defer acancel()
	bctx, bcancel := context.WithTimeout(metadata.NewIncomingContext(context.Background(), md), 5*time.Second)
	defer bcancel()
	aerr := make(chan error, 1)
	go func() { _, err := intercept(actx, in, info, handler); aerr <- err }()
	for runs.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	start := time.Now()
	out, berr := intercept(bctx, in, info, handler)
	t.Logf("A: %v; B after %v: out=%v err=%v (%T), runs=%d", <-aerr, time.Since(start), out, berr, berr, runs.Load())
	assert.NoError(t, berr, "B had 4.9s left but got A's deadline failure")
}
