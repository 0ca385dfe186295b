package idemgrpc_test

import (
	"context"
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
