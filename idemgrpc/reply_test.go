package idemgrpc_test

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemgrpc"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// bigHandler answers a message of about size bytes, counting its runs.
func bigHandler(runs *atomic.Int32, size int) doHandler {
	return func(ctx context.Context, in *structpb.Struct) (*structpb.Struct, error) {
		runs.Add(1)
		_ = grpc.SetHeader(ctx, metadata.Pairs("charge-id", "ch_1"))
		_ = grpc.SetTrailer(ctx, metadata.Pairs("ledger", "posted"))
		return structpb.NewStruct(map[string]any{"statement": strings.Repeat("x", size)})
	}
}

// A response over the default bound (1 MiB) goes whole to the first caller
// and is remembered without its message: the call is done, never run
// again, and a replay says what it omits (AlreadyExists, marked), which
// the client interceptor does not retry.
func TestOversizedReplyIsRememberedWithoutMessage(t *testing.T) {
	for name, storeOpts := range map[string]idem.Options{"memory": {}, "backend": {Backend: idemtest.NewMemoryBackend()}} {
		t.Run(name, func(t *testing.T) {
			var runs, attempts atomic.Int32
			count := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
				attempts.Add(1)
				return handler(ctx, req)
			}
			conn := startDo(t, bigHandler(&runs, 1<<20+1), []grpc.UnaryServerInterceptor{count, idemgrpc.UnaryServerInterceptor(newStore(t, storeOpts), idemgrpc.Options{})},
				idemgrpc.UnaryClientInterceptor(idemgrpc.ClientOptions{}))
			first, err := callDo(context.Background(), conn, "k", grpc.MaxCallRecvMsgSize(8<<20))
			require.NoError(t, err)
			require.Len(t, first.Fields["statement"].GetStringValue(), 1<<20+1, "the first caller gets the whole response")
			size := proto.Size(first)

			var header, trailer metadata.MD
			again, err := callDo(context.Background(), conn, "k", grpc.Header(&header), grpc.Trailer(&trailer), grpc.MaxCallRecvMsgSize(8<<20))
			require.Error(t, err, "a replay must not pass for the whole answer: got %d bytes", proto.Size(again))
			assert.Equal(t, codes.AlreadyExists, code(err), "%v", err)
			assert.Contains(t, status.Convert(err).Message(), "too large to keep")
			assert.Contains(t, status.Convert(err).Message(), "("+strconv.Itoa(size)+" bytes)")
			assert.Equal(t, []string{"true"}, header.Get(idemgrpc.ReplayedHeader))
			assert.Equal(t, []string{"true"}, header.Get("idempotent-body-omitted"))
			assert.Equal(t, []string{"ch_1"}, header.Get("charge-id"), "the metadata is still replayed")
			assert.Equal(t, []string{"posted"}, trailer.Get("ledger"))
			assert.Equal(t, int32(1), runs.Load(), "a finished success is never run again")
			assert.Equal(t, int32(2), attempts.Load(), "the client does not retry the omitted replay")
		})
	}
}

// MaxStoredReply sets the bound: a response within it is replayed whole,
// one past it is omitted.
func TestMaxStoredReplyBound(t *testing.T) {
	var runs atomic.Int32
	conn := startDo(t, func(ctx context.Context, in *structpb.Struct) (*structpb.Struct, error) {
		runs.Add(1)
		return structpb.NewStruct(map[string]any{"statement": strings.Repeat("x", int(in.Fields["amount"].GetNumberValue()))})
	}, []grpc.UnaryServerInterceptor{idemgrpc.UnaryServerInterceptor(newStore(t, idem.Options{}), idemgrpc.Options{MaxStoredReply: 1000})})
	call := func(key string, n int, opts ...grpc.CallOption) (*structpb.Struct, error) {
		in, _ := structpb.NewStruct(map[string]any{"amount": float64(n)})
		out := new(structpb.Struct)
		return out, conn.Invoke(idemgrpc.WithKey(context.Background(), key), doMethod, in, out, opts...)
	}
	for range 2 {
		small, err := call("small", 900)
		require.NoError(t, err)
		assert.Len(t, small.Fields["statement"].GetStringValue(), 900)
	}
	big, err := call("big", 1100)
	require.NoError(t, err)
	assert.Len(t, big.Fields["statement"].GetStringValue(), 1100)
	var header metadata.MD
	_, err = call("big", 1100, grpc.Header(&header))
	assert.Equal(t, codes.AlreadyExists, code(err))
	assert.Equal(t, []string{"true"}, header.Get(idemgrpc.BodyOmittedHeader))
	assert.Equal(t, int32(2), runs.Load())
}

// Calls that waited on the execution whose response was too large get
// the same answer as any later retry: the message is not kept for them.
func TestWaiterOnOversizedReplyGetsOmittedAnswer(t *testing.T) {
	var runs atomic.Int32
	entered, gate := make(chan struct{}), make(chan struct{})
	conn := startDo(t, func(ctx context.Context, in *structpb.Struct) (*structpb.Struct, error) {
		if runs.Add(1) == 1 {
			close(entered)
		}
		<-gate
		return structpb.NewStruct(map[string]any{"statement": strings.Repeat("x", 2000)})
	}, []grpc.UnaryServerInterceptor{idemgrpc.UnaryServerInterceptor(newStore(t, idem.Options{}), idemgrpc.Options{MaxStoredReply: 1000, Wait: time.Minute})})
	first := make(chan error, 1)
	go func() {
		out, err := callDo(context.Background(), conn, "k")
		if err == nil && len(out.Fields["statement"].GetStringValue()) != 2000 {
			err = errors.New("the first caller did not get the whole response")
		}
		first <- err
	}()
	<-entered
	waiter := make(chan error, 1)
	go func() { _, err := callDo(context.Background(), conn, "k"); waiter <- err }()
	time.Sleep(50 * time.Millisecond) // parked on the claim, or arriving after: the answer is the same
	close(gate)
	require.NoError(t, <-first)
	err := <-waiter
	assert.Equal(t, codes.AlreadyExists, code(err), "%v", err)
	assert.Equal(t, int32(1), runs.Load())
}

// The JSON codec keeps Omitted, and records written before it existed
// still decode, as whole replies.
func TestReplyJSONKeepsOmitted(t *testing.T) {
	in := idemgrpc.Reply{Header: metadata.Pairs("charge-id", "ch_1"), Trailer: metadata.Pairs("ledger", "posted"), Omitted: 2 << 20}
	b, err := json.Marshal(in)
	require.NoError(t, err)
	var out idemgrpc.Reply
	require.NoError(t, json.Unmarshal(b, &out))
	assert.Equal(t, in, out)

	older := `{"message":"Ci90eXBlLmdvb2dsZWFwaXMuY29tL2dvb2dsZS5wcm90b2J1Zi5TdHJpbmdWYWx1ZRIECgJoaQ==","header":{"charge-id":["Y2hfMQ=="]}}`
	var old idemgrpc.Reply
	require.NoError(t, json.Unmarshal([]byte(older), &old))
	assert.Zero(t, old.Omitted)
	assert.NotEmpty(t, old.Message)
	assert.Equal(t, []string{"ch_1"}, old.Header.Get("charge-id"))
}
