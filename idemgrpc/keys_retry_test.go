package idemgrpc_test

import (
	"context"
	"sync"
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
)

// A proxy that joins two idempotency-key fields makes one value "a, b":
// the server refuses it as a list instead of running the call under a key
// that no retry sends. A key that holds a comma travels quoted from
// WithKey, and the server reads it back as the same key.
func TestCommaJoinedKeysAreRefusedAndQuotedKeysRead(t *testing.T) {
	p := &payments{}
	var (
		mu   sync.Mutex
		sent []string
	)
	record := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		mu.Lock()
		sent = append(sent, md.Get(idemgrpc.KeyHeader)...)
		mu.Unlock()
		return handler(ctx, req)
	}
	conn := startBuf(t, p, []grpc.UnaryServerInterceptor{record, idemgrpc.UnaryServerInterceptor(newStore(t, idem.Options{}), idemgrpc.Options{})})

	joined := metadata.AppendToOutgoingContext(context.Background(), idemgrpc.KeyHeader, "order-1, order-2")
	_, err := charge(joined, conn, "", 450)
	assert.Equal(t, codes.InvalidArgument, code(err), "a comma-joined pair of keys is a list, not a key")
	assert.Zero(t, p.runs.Load(), "nothing ran under the joined value")

	_, err = charge(context.Background(), conn, "order,7", 450)
	require.NoError(t, err)
	_, err = charge(context.Background(), conn, "order,7", 450)
	require.NoError(t, err)
	assert.Equal(t, int32(1), p.runs.Load(), "the quoted key is one key: the retry replayed")
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, `"order,7"`, sent[len(sent)-1], "WithKey sends a key with a comma quoted")
}

// A server that asks for a longer wait than MaxBackoff (RetryInfo) is not
// retried sooner than it asks: its answer goes back to the caller.
func TestClientNeverRetriesSoonerThanRetryInfoAsks(t *testing.T) {
	var (
		mu    sync.Mutex
		calls int
	)
	busy := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		mu.Lock()
		calls++
		mu.Unlock()
		st, _ := status.New(codes.Aborted, "in flight; retry later").WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(time.Hour)})
		return nil, st.Err()
	}
	conn := startBuf(t, &payments{}, []grpc.UnaryServerInterceptor{busy},
		idemgrpc.UnaryClientInterceptor(idemgrpc.ClientOptions{MinBackoff: time.Millisecond, MaxBackoff: time.Millisecond}))
	_, err := charge(context.Background(), conn, "order-9", 450)
	assert.Equal(t, codes.Aborted, code(err))
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, 1, calls, "retried after 1 ms where the server asked for an hour")
}

// A RetryInfo within MaxBackoff is honoured: the call is retried after it.
func TestClientRetriesAfterRetryInfo(t *testing.T) {
	var (
		mu    sync.Mutex
		calls int
	)
	p := &payments{}
	once := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		mu.Lock()
		calls++
		first := calls == 1
		mu.Unlock()
		if first {
			st, _ := status.New(codes.Aborted, "in flight").WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(time.Millisecond)})
			return nil, st.Err()
		}
		return handler(ctx, req)
	}
	conn := startBuf(t, p, []grpc.UnaryServerInterceptor{once},
		idemgrpc.UnaryClientInterceptor(idemgrpc.ClientOptions{MinBackoff: time.Millisecond, MaxBackoff: time.Second}))
	_, err := charge(context.Background(), conn, "order-10", 450)
	require.NoError(t, err)
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, 2, calls)
}

// WithKey's doc: a key that is valid for idem but not printable ASCII
// cannot travel in gRPC metadata, and the call fails on the client,
// loudly (codes.Internal), with nothing sent.
func TestNonASCIIKeyFailsOnTheClient(t *testing.T) {
	require.NoError(t, idem.CheckKey("ü-1"), "a key idem accepts")
	p := &payments{}
	conn := startBuf(t, p, []grpc.UnaryServerInterceptor{idemgrpc.UnaryServerInterceptor(newStore(t, idem.Options{}), idemgrpc.Options{})})
	_, err := charge(context.Background(), conn, "ü-1", 450)
	assert.Equal(t, codes.Internal, code(err))
	assert.Zero(t, p.runs.Load(), "nothing ran")
}

// Keys that the key field treats specially, sent with WithKey through a
// real gRPC connection: each is one key on the server (its retry replays)
// and no two collide, a key and its quoted spelling included ("a" and a,
// " x" and x, a,b and "a,b"). "a, b", the value a proxy makes of two
// fields, is one key when WithKey sends it: it travels quoted; the bare
// value is refused (TestCommaJoinedKeysAreRefusedAndQuotedKeysRead).
func TestSpecialKeysRoundTripThroughGRPC(t *testing.T) {
	p := &payments{}
	conn := startBuf(t, p, []grpc.UnaryServerInterceptor{idemgrpc.UnaryServerInterceptor(newStore(t, idem.Options{}), idemgrpc.Options{Unscoped: true})})
	keys := []string{"a", `"a"`, `"a`, `a"`, `\"a\"`, "a,b", `"a,b"`, `a\,b`, "x", " x", "x ", " x ", `\`, `\\`, `"`, `""`, ";p=1", `"k";p=1`, "a, b", " "}
	for i, key := range keys {
		first, err := charge(context.Background(), conn, key, 1)
		require.NoError(t, err, "key %q", key)
		again, err := charge(context.Background(), conn, key, 1)
		require.NoError(t, err, "key %q", key)
		assert.Equal(t, first.AsMap(), again.AsMap(), "key %q: the retry was not answered the first reply", key)
		assert.Equal(t, int32(i+1), p.runs.Load(), "key %q ran again, or shared another key's run", key)
	}
}
