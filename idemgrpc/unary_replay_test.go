package idemgrpc_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemgrpc"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
)

// A final error with details (ErrorInfo, BadRequest, ...): the first
// caller, not only the replay, gets a status rebuilt from code and message.
func TestFinalErrorKeepsDetails(t *testing.T) {
	var runs atomic.Int32
	conn := startDo(t, func(ctx context.Context, in *structpb.Struct) (*structpb.Struct, error) {
		runs.Add(1)
		st, _ := status.New(codes.FailedPrecondition, "card declined").WithDetails(&errdetails.ErrorInfo{Reason: "CARD_DECLINED", Domain: "pay.example"})
		return nil, idem.Final(st.Err())
	}, []grpc.UnaryServerInterceptor{idemgrpc.UnaryServerInterceptor(newStore(t, idem.Options{}), idemgrpc.Options{})})
	_, err := callDo(context.Background(), conn, "k")
	assert.Equal(t, codes.FailedPrecondition, status.Code(err))
	assert.Len(t, status.Convert(err).Details(), 1, "the first caller loses the handler's error details")
	_, err = callDo(context.Background(), conn, "k")
	assert.Equal(t, codes.FailedPrecondition, status.Code(err))
	assert.Len(t, status.Convert(err).Details(), 1, "the replay loses the error details")
	assert.Equal(t, int32(1), runs.Load())
}

// A handler may return an object it keeps (a cache, a repository) and
// change it later: the replay from memory is still what the first caller
// got, not the handler's message as it is now.
func TestReplayDoesNotAliasTheHandlersMessage(t *testing.T) {
	order, _ := structpb.NewStruct(map[string]any{"status": "paid"})
	var mu sync.Mutex
	conn := startDo(t, func(ctx context.Context, in *structpb.Struct) (*structpb.Struct, error) {
		mu.Lock()
		defer mu.Unlock()
		return order, nil // the repository's record
	}, []grpc.UnaryServerInterceptor{idemgrpc.UnaryServerInterceptor(newStore(t, idem.Options{}), idemgrpc.Options{})})
	first, err := callDo(context.Background(), conn, "k")
	require.NoError(t, err)
	mu.Lock()
	order.Fields["status"] = structpb.NewStringValue("refunded") // the order moves on
	mu.Unlock()
	replay, err := callDo(context.Background(), conn, "k")
	require.NoError(t, err)
	assert.Equal(t, first.Fields["status"].GetStringValue(), replay.Fields["status"].GetStringValue(), "the replay is not the first answer")
}

// An outer interceptor that adapts a response per caller (redaction)
// changes only its own caller's reply, never the one later replays answer.
func TestOuterInterceptorCannotChangeLaterReplays(t *testing.T) {
	redact := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		resp, err := handler(ctx, req)
		if s, ok := resp.(*structpb.Struct); ok {
			md, _ := metadata.FromIncomingContext(ctx)
			if r := md.Get("role"); len(r) == 0 || r[0] != "admin" {
				delete(s.Fields, "card")
			}
		}
		return resp, err
	}
	conn := startDo(t, func(ctx context.Context, in *structpb.Struct) (*structpb.Struct, error) {
		return structpb.NewStruct(map[string]any{"charge": 1.0, "card": "4242"})
	}, []grpc.UnaryServerInterceptor{redact, idemgrpc.UnaryServerInterceptor(newStore(t, idem.Options{}), idemgrpc.Options{})})
	admin := metadata.AppendToOutgoingContext(context.Background(), "role", "admin")
	first, err := callDo(admin, conn, "k")
	require.NoError(t, err)
	require.Equal(t, "4242", first.Fields["card"].GetStringValue())
	_, err = callDo(context.Background(), conn, "k") // a clerk's retry: redacted
	require.NoError(t, err)
	again, err := callDo(admin, conn, "k")
	require.NoError(t, err)
	assert.Equal(t, "4242", again.Fields["card"].GetStringValue(), "the clerk's redaction was written into the remembered reply")
}

// The same, concurrently: replays that outer interceptors change at once
// share no message (run with -race).
func TestConcurrentReplaysMayBeMutatedWithoutARace(t *testing.T) {
	stamp := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		resp, err := handler(ctx, req)
		if s, ok := resp.(*structpb.Struct); ok {
			s.Fields["served_at"] = structpb.NewNumberValue(float64(time.Now().UnixNano())) // per-response stamp
		}
		return resp, err
	}
	conn := startDo(t, func(ctx context.Context, in *structpb.Struct) (*structpb.Struct, error) {
		return structpb.NewStruct(map[string]any{"charge": 1.0})
	}, []grpc.UnaryServerInterceptor{stamp, idemgrpc.UnaryServerInterceptor(newStore(t, idem.Options{}), idemgrpc.Options{})})
	_, err := callDo(context.Background(), conn, "k")
	require.NoError(t, err)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 20 {
				_, _ = callDo(context.Background(), conn, "k")
			}
		}()
	}
	wg.Wait()
}

// "-bin" metadata holds arbitrary bytes: through a Backend (JSON codec) the
// replay's bytes are the original's.
func TestBinaryMetadataReplaysThroughABackend(t *testing.T) {
	raw := string([]byte{0xff, 0x00, 0x80, 0x41})
	conn := startDo(t, func(ctx context.Context, in *structpb.Struct) (*structpb.Struct, error) {
		_ = grpc.SetHeader(ctx, metadata.Pairs("trace-bin", raw))
		_ = grpc.SetTrailer(ctx, metadata.Pairs("sig-bin", raw))
		return structpb.NewStruct(map[string]any{"charge": 1.0})
	}, []grpc.UnaryServerInterceptor{idemgrpc.UnaryServerInterceptor(newStore(t, idem.Options{Backend: idemtest.NewMemoryBackend()}), idemgrpc.Options{})})
	var h1, t1, h2, t2 metadata.MD
	_, err := callDo(context.Background(), conn, "k", grpc.Header(&h1), grpc.Trailer(&t1))
	require.NoError(t, err)
	require.Equal(t, []string{raw}, h1.Get("trace-bin"))
	_, err = callDo(context.Background(), conn, "k", grpc.Header(&h2), grpc.Trailer(&t2))
	require.NoError(t, err)
	require.Equal(t, []string{"true"}, h2.Get(idemgrpc.ReplayedHeader))
	assert.Equal(t, []byte(raw), []byte(first(h2.Get("trace-bin"))), "binary header bytes replayed wrong")
	assert.Equal(t, []byte(raw), []byte(first(t2.Get("sig-bin"))), "binary trailer bytes replayed wrong")
}

func first(v []string) string {
	if len(v) == 0 {
		return "<none>"
	}
	return v[0]
}

// A handler that returns (nil, nil) has run and succeeded: the retry must
// not run it again.
func TestNilResponseRunsOnce(t *testing.T) {
	var runs atomic.Int32
	conn := startDo(t, func(ctx context.Context, in *structpb.Struct) (*structpb.Struct, error) {
		runs.Add(1) // the side effect
		return nil, nil
	}, []grpc.UnaryServerInterceptor{idemgrpc.UnaryServerInterceptor(newStore(t, idem.Options{}), idemgrpc.Options{})})
	_, err1 := callDo(context.Background(), conn, "k")
	_, err2 := callDo(context.Background(), conn, "k")
	t.Logf("first: %v; retry: %v", err1, err2)
	assert.Equal(t, int32(1), runs.Load(), "a handler that returned without error ran twice for one key")
}

// Held keys: several key values, huge keys, scoping, client deadline
// shorter than Wait, client retries with one key.
func TestKeysAreCheckedScopedAndWaitedOnUntilTheDeadline(t *testing.T) {
	var runs atomic.Int32
	gate := make(chan struct{})
	var gated atomic.Bool
	var keys sync.Map
	store := newStore(t, idem.Options{})
	conn := startDo(t, func(ctx context.Context, in *structpb.Struct) (*structpb.Struct, error) {
		n := runs.Add(1)
		md, _ := metadata.FromIncomingContext(ctx)
		keys.Store(first(md.Get(idemgrpc.KeyHeader)), true)
		if gated.Load() {
			<-gate
		}
		return structpb.NewStruct(map[string]any{"charge": float64(n), "who": first(md.Get("who"))})
	}, []grpc.UnaryServerInterceptor{idemgrpc.UnaryServerInterceptor(store, idemgrpc.Options{
		Wait: time.Second,
		Scope: func(ctx context.Context) (string, error) {
			md, _ := metadata.FromIncomingContext(ctx)
			return first(md.Get("who")), nil
		},
	})})
	ctx := metadata.AppendToOutgoingContext(context.Background(), idemgrpc.KeyHeader, "a", idemgrpc.KeyHeader, "b")
	_, err := callDo(ctx, conn, "")
	assert.Equal(t, codes.InvalidArgument, status.Code(err))
	big := make([]byte, 300)
	for i := range big {
		big[i] = 'k'
	}
	_, err = callDo(context.Background(), conn, string(big))
	assert.Equal(t, codes.InvalidArgument, status.Code(err))
	alice := metadata.AppendToOutgoingContext(context.Background(), "who", "alice")
	bob := metadata.AppendToOutgoingContext(context.Background(), "who", "bob")
	a, err := callDo(alice, conn, "same")
	require.NoError(t, err)
	b, err := callDo(bob, conn, "same")
	require.NoError(t, err)
	assert.Equal(t, "alice", a.Fields["who"].GetStringValue())
	assert.Equal(t, "bob", b.Fields["who"].GetStringValue())

	// Deadline shorter than Wait on a duplicate.
	gated.Store(true)
	before := runs.Load()
	done := make(chan error, 1)
	go func() { _, err := callDo(alice, conn, "slow"); done <- err }()
	for runs.Load() == before {
		time.Sleep(time.Millisecond)
	}
	dctx, cancel := context.WithTimeout(alice, 50*time.Millisecond)
	_, err = callDo(dctx, conn, "slow")
	cancel()
	assert.Equal(t, codes.DeadlineExceeded, status.Code(err))
	close(gate)
	require.NoError(t, <-done)
	gated.Store(false)
	r, err := callDo(alice, conn, "slow")
	require.NoError(t, err)
	assert.Equal(t, float64(before+1), r.Fields["charge"].GetNumberValue())
	assert.Equal(t, before+1, runs.Load())
}
