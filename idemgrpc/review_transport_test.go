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
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
)

// A header set after the headers were sent is refused by gRPC (the first
// caller never gets it), but the recorder keeps it: the replay is not the
// first answer.
func TestReviewHeaderRefusedByGRPCIsReplayed(t *testing.T) {
	var setErr error
	conn := rvStart(t, func(ctx context.Context, in *structpb.Struct) (*structpb.Struct, error) {
		_ = grpc.SendHeader(ctx, metadata.Pairs("charge-id", "ch_1"))
		setErr = grpc.SetHeader(ctx, metadata.Pairs("late", "never-sent"))
		return in, nil
	}, []grpc.UnaryServerInterceptor{idemgrpc.UnaryServerInterceptor(rvStore(t, idem.Options{}), idemgrpc.Options{Unscoped: true})})
	var h1, h2 metadata.MD
	_, err := rvCall(context.Background(), conn, "k", grpc.Header(&h1))
	require.NoError(t, err)
	require.Error(t, setErr, "gRPC refuses a header after SendHeader")
	_, err = rvCall(context.Background(), conn, "k", grpc.Header(&h2))
	require.NoError(t, err)
	require.Equal(t, []string{"true"}, h2.Get(idemgrpc.ReplayedHeader))
	assert.Equal(t, h1.Get("late"), h2.Get("late"), "the replay carries a header the first caller never got")
}

// A key that a proxy made of two idempotency-key fields ("a, b") is one
// key to the gRPC interceptor; idemhttp refuses the same value.
func TestReviewCommaJoinedKeyAccepted(t *testing.T) {
	var runs atomic.Int32
	conn := rvStart(t, func(ctx context.Context, in *structpb.Struct) (*structpb.Struct, error) { runs.Add(1); return in, nil },
		[]grpc.UnaryServerInterceptor{idemgrpc.UnaryServerInterceptor(rvStore(t, idem.Options{}), idemgrpc.Options{Unscoped: true})})
	_, err := rvCall(context.Background(), conn, "a, b")
	t.Logf("comma key: %v runs=%d", status.Code(err), runs.Load())
}
