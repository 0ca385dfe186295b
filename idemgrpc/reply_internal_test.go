package idemgrpc

import (
	"context"
	"crypto/rand"
	"net"
	"testing"

	"github.com/seed094d4201/idem"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

const blobMethod = "/idem.internal.Blobs/Get"

// startBlobs serves h as blobMethod, a unary method from StringValue to
// BytesValue, over a bufconn listener with the interceptor.
func startBlobs(t *testing.T, intercept grpc.UnaryServerInterceptor, h func(context.Context, *wrapperspb.StringValue) (*wrapperspb.BytesValue, error)) *grpc.ClientConn {
	t.Helper()
	desc := grpc.ServiceDesc{
		ServiceName: "idem.internal.Blobs",
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{
			MethodName: "Get",
			Handler: func(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
				in := new(wrapperspb.StringValue)
				if err := dec(in); err != nil {
					return nil, err
				}
				return interceptor(ctx, in, &grpc.UnaryServerInfo{FullMethod: blobMethod}, func(ctx context.Context, req any) (any, error) {
					return h(ctx, req.(*wrapperspb.StringValue))
				})
			},
		}},
	}
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer(grpc.UnaryInterceptor(intercept))
	srv.RegisterService(&desc, struct{}{})
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient("passthrough:///bufnet", grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return conn
}

// remembered returns the Reply the store holds for req under key.
func remembered(t *testing.T, store *idem.Store[Reply], key string, req proto.Message) Reply {
	t.Helper()
	fp, err := fingerprint(blobMethod, req)
	require.NoError(t, err)
	tk, err := store.Begin(context.Background(), key, fp[:])
	require.NoError(t, err)
	defer tk.Release()
	require.True(t, tk.Replayed(), "the call was remembered")
	reply, err := tk.Result()
	require.NoError(t, err)
	return reply
}

// A remembered reply of about 1 MiB holds about 1 MiB: Message, the
// google.protobuf.Any a Backend gets, with the response's own wire form a
// part of it rather than a second copy.
func TestRememberedReplyHoldsOneCopy(t *testing.T) {
	blob := make([]byte, 1<<20-64) // within the default MaxStoredReply
	_, _ = rand.Read(blob)
	want := wrapperspb.Bytes(blob)
	store := idem.New[Reply](idem.Options{})
	t.Cleanup(func() { store.Close() })
	conn := startBlobs(t, UnaryServerInterceptor(store, Options{}), func(context.Context, *wrapperspb.StringValue) (*wrapperspb.BytesValue, error) {
		return wrapperspb.Bytes(blob), nil
	})
	req := wrapperspb.String("statement")
	ctx := WithKey(context.Background(), "k")
	for range 2 { // the first call, then its replay
		got := new(wrapperspb.BytesValue)
		require.NoError(t, conn.Invoke(ctx, blobMethod, req, got))
		require.True(t, proto.Equal(want, got))
	}

	reply := remembered(t, store, scopedKey("", "k"), req)
	value, err := proto.Marshal(want)
	require.NoError(t, err)
	wire, err := proto.Marshal(&anypb.Any{TypeUrl: "type.googleapis.com/google.protobuf.BytesValue", Value: value})
	require.NoError(t, err)
	assert.Equal(t, wire, reply.Message, "Message is the Any's wire form")
	assert.LessOrEqual(t, cap(reply.Message), len(wire)+64, "Message holds no spare capacity")
	require.Len(t, reply.raw, len(value))
	assert.True(t, &reply.raw[0] == &reply.Message[len(reply.Message)-len(reply.raw)],
		"the response's bytes are held twice: raw is not a part of Message (%d bytes more)", len(reply.raw))
}

// marshalAny makes the bytes proto.Marshal makes of the anypb.Any, empty
// value included, and splitAny takes them apart again without copying.
func TestMarshalAnyMatchesAnypb(t *testing.T) {
	for _, m := range []proto.Message{&emptypb.Empty{}, wrapperspb.String(""), wrapperspb.String("hi"), wrapperspb.Bytes(make([]byte, 300))} {
		value, err := proto.Marshal(m)
		require.NoError(t, err)
		a, err := anypb.New(m)
		require.NoError(t, err)
		want, err := proto.Marshal(a)
		require.NoError(t, err)
		wire, raw, err := marshalAny(m, proto.Size(m))
		require.NoError(t, err)
		assert.Equal(t, want, wire, "%T", m)
		assert.Equal(t, len(want), cap(wire), "%T: exact capacity", m)
		assert.Equal(t, len(value), len(raw), "%T", m)

		url, got, err := splitAny(wire)
		require.NoError(t, err)
		assert.Equal(t, a.TypeUrl, url)
		assert.Equal(t, len(value), len(got))
		if len(got) > 0 {
			assert.True(t, &got[0] == &wire[len(wire)-len(got)], "splitAny copied the value")
		}
	}
	_, _, err := marshalAny(wrapperspb.String("hi"), 3) // a size that no longer holds
	assert.Error(t, err)
	_, _, err = splitAny([]byte{0x0a, 0x05, 'a'}) // truncated
	assert.Error(t, err)
}

// The keys never stored, whatever StoredMetadata says, compared without
// regard to case.
func TestNeverStoredMetadata(t *testing.T) {
	p := newMetadataPolicy([]string{"Set-Cookie", "grpc-retry-pushback-ms", ":status", "Content-Type", "charge-id"}, nil)
	md := metadata.MD{"Set-Cookie": {"s=1"}, "authorization": {"Bearer x"}, "grpc-retry-pushback-ms": {"10"}, ":status": {"200"},
		"content-type": {"application/grpc"}, "Idempotent-Replayed": {"false"}, "Charge-Id": {"ch_1"}, "te": {"trailers"}}
	assert.Equal(t, metadata.MD{"charge-id": {"ch_1"}}, p.filter(md))
	assert.Nil(t, p.filter(metadata.MD{"cookie": {"c=1"}}))
}

// A record stored before a key was barred (by an older version, or before
// SkipMetadata named it) is filtered when it is replayed.
func TestReplayFiltersRecordsStoredBefore(t *testing.T) {
	store := idem.New[Reply](idem.Options{})
	t.Cleanup(func() { store.Close() })
	req := wrapperspb.String("statement")
	fp, err := fingerprint(blobMethod, req)
	require.NoError(t, err)
	wire, _, err := marshalAny(wrapperspb.Bytes([]byte("ok")), proto.Size(wrapperspb.Bytes([]byte("ok"))))
	require.NoError(t, err)
	_, err = store.RunOnce(context.Background(), scopedKey("", "k"), fp[:], func(context.Context) (Reply, error) {
		return Reply{Message: wire, Header: metadata.Pairs("set-cookie", "s=1", "request-id", "r1", "charge-id", "ch_1"),
			Trailer: metadata.Pairs("authorization", "Bearer x", "ledger", "posted")}, nil
	})
	require.NoError(t, err)
	conn := startBlobs(t, UnaryServerInterceptor(store, Options{SkipMetadata: []string{"request-id"}}), func(context.Context, *wrapperspb.StringValue) (*wrapperspb.BytesValue, error) {
		t.Error("the handler ran for a remembered key")
		return nil, nil
	})
	var header, trailer metadata.MD
	got := new(wrapperspb.BytesValue)
	require.NoError(t, conn.Invoke(WithKey(context.Background(), "k"), blobMethod, req, got, grpc.Header(&header), grpc.Trailer(&trailer)))
	assert.Equal(t, "ok", string(got.GetValue()))
	assert.Equal(t, []string{"true"}, header.Get(ReplayedHeader))
	assert.Equal(t, []string{"ch_1"}, header.Get("charge-id"))
	assert.Empty(t, header.Get("set-cookie"))
	assert.Empty(t, header.Get("request-id"))
	assert.Equal(t, []string{"posted"}, trailer.Get("ledger"))
	assert.Empty(t, trailer.Get("authorization"))
}
