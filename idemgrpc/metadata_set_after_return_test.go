package idemgrpc_test

import (
	"context"
	"testing"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemgrpc"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"
)

// A handler's goroutine that sets headers or trailers after the handler
// returned is refused: what it sets reaches neither the first caller nor
// the remembered reply, so the first answer and every replay carry the
// same metadata, the handler's as it returned. (It used to reach the
// first caller alone, or, with a header already set, be added to the
// remembered reply in memory, racing with the replays that read it.)
func TestMetadataSetAfterTheHandlerReturnedIsRefused(t *testing.T) {
	late := make(chan context.Context, 1)
	lateErrs := make(chan [2]error, 1)
	// Outside the guard: the handler has returned, and the guard with it,
	// before the late calls are made; the answer goes out after them.
	afterReturn := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		resp, err := handler(ctx, req)
		select {
		case hctx := <-late:
			lateErrs <- [2]error{
				grpc.SetHeader(hctx, metadata.Pairs("late-header", "1", "charge-id", "ch_late")),
				grpc.SetTrailer(hctx, metadata.Pairs("late-trailer", "1")),
			}
		default:
		}
		return resp, err
	}
	conn := startDo(t, func(ctx context.Context, in *structpb.Struct) (*structpb.Struct, error) {
		_ = grpc.SetHeader(ctx, metadata.Pairs("charge-id", "ch_1"))
		_ = grpc.SetTrailer(ctx, metadata.Pairs("ledger", "posted"))
		late <- ctx // the handler's goroutine, which outlives it
		return structpb.NewStruct(map[string]any{"charge": 1.0})
	}, []grpc.UnaryServerInterceptor{afterReturn, idemgrpc.UnaryServerInterceptor(newStore(t, idem.Options{}), idemgrpc.Options{})})

	var h1, t1 metadata.MD
	_, err := callDo(context.Background(), conn, "k", grpc.Header(&h1), grpc.Trailer(&t1))
	require.NoError(t, err)
	errs := <-lateErrs
	assert.Error(t, errs[0], "a header set after the handler returned is refused")
	assert.Error(t, errs[1], "a trailer set after the handler returned is refused")
	var h2, t2 metadata.MD
	_, err = callDo(context.Background(), conn, "k", grpc.Header(&h2), grpc.Trailer(&t2))
	require.NoError(t, err)
	for _, md := range []metadata.MD{h1, t1, h2, t2} {
		assert.Empty(t, md.Get("late-header"))
		assert.Empty(t, md.Get("late-trailer"))
	}
	assert.Equal(t, []string{"ch_1"}, h1.Get("charge-id"))
	assert.Equal(t, []string{"ch_1"}, h2.Get("charge-id"), "the replay's header is the first answer's")
	assert.Equal(t, []string{"posted"}, t2.Get("ledger"))
}
