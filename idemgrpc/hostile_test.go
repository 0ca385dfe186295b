package idemgrpc_test

import (
	"context"
	"net"
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
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
)

const rvMethod = "/idem.review.Svc/Do"

type rvHandler func(ctx context.Context, in *structpb.Struct) (*structpb.Struct, error)

func rvStart(t *testing.T, h rvHandler, server []grpc.UnaryServerInterceptor, client ...grpc.UnaryClientInterceptor) *grpc.ClientConn {
	t.Helper()
	desc := grpc.ServiceDesc{
		ServiceName: "idem.review.Svc",
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{
			MethodName: "Do",
			Handler: func(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
				in := new(structpb.Struct)
				if err := dec(in); err != nil {
					return nil, err
				}
				handler := func(ctx context.Context, req any) (any, error) {
					out, err := h(ctx, req.(*structpb.Struct))
					if out == nil {
						return nil, err // a handler returning (nil, nil): untyped nil, as generated code passes it on
					}
					return out, err
				}
				return interceptor(ctx, in, &grpc.UnaryServerInfo{FullMethod: rvMethod}, handler)
			},
		}},
	}
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(server...))
	srv.RegisterService(&desc, struct{}{})
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithChainUnaryInterceptor(client...),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return conn
}

func rvStore(t *testing.T, opts idem.Options) *idem.Store[idemgrpc.Reply] {
	s := idem.New[idemgrpc.Reply](opts)
	t.Cleanup(func() { s.Close() })
	return s
}

func rvCall(ctx context.Context, conn *grpc.ClientConn, key string, opts ...grpc.CallOption) (*structpb.Struct, error) {
	if key != "" {
		ctx = idemgrpc.WithKey(ctx, key)
	}
	in, _ := structpb.NewStruct(map[string]any{"amount": 450.0})
	out := new(structpb.Struct)
	err := conn.Invoke(ctx, rvMethod, in, out, opts...)
	return out, err
}

// A final error with details (ErrorInfo, BadRequest, ...): the first
// caller, not only the replay, gets a status rebuilt from code and message.
func TestHostileGRPCFinalErrorKeepsDetails(t *testing.T) {
	var runs atomic.Int32
	conn := rvStart(t, func(ctx context.Context, in *structpb.Struct) (*structpb.Struct, error) {
		runs.Add(1)
		st, _ := status.New(codes.FailedPrecondition, "card declined").WithDetails(&errdetails.ErrorInfo{Reason: "CARD_DECLINED", Domain: "pay.example"})
		return nil, idem.Final(st.Err())
	}, []grpc.UnaryServerInterceptor{idemgrpc.UnaryServerInterceptor(rvStore(t, idem.Options{}), idemgrpc.Options{})})
	_, err := rvCall(context.Background(), conn, "k")
	assert.Equal(t, codes.FailedPrecondition, status.Code(err))
	assert.Len(t, status.Convert(err).Details(), 1, "the first caller loses the handler's error details")
	_, err = rvCall(context.Background(), conn, "k")
	assert.Equal(t, codes.FailedPrecondition, status.Code(err))
	assert.Len(t, status.Convert(err).Details(), 1, "the replay loses the error details")
	assert.Equal(t, int32(1), runs.Load())
}

// The replay from memory hands out the handler's own message: a handler
// that returns an object it keeps (a cache, a repository) and changes
// later makes the replay differ from what the first caller got.
func TestHostileGRPCReplayAliasesHandlerMessage(t *testing.T) {
	order, _ := structpb.NewStruct(map[string]any{"status": "paid"})
	var mu sync.Mutex
	conn := rvStart(t, func(ctx context.Context, in *structpb.Struct) (*structpb.Struct, error) {
		mu.Lock()
		defer mu.Unlock()
		return order, nil // the repository's record
	}, []grpc.UnaryServerInterceptor{idemgrpc.UnaryServerInterceptor(rvStore(t, idem.Options{}), idemgrpc.Options{})})
	first, err := rvCall(context.Background(), conn, "k")
	require.NoError(t, err)
	mu.Lock()
	order.Fields["status"] = structpb.NewStringValue("refunded") // the order moves on
	mu.Unlock()
	replay, err := rvCall(context.Background(), conn, "k")
	require.NoError(t, err)
	assert.Equal(t, first.Fields["status"].GetStringValue(), replay.Fields["status"].GetStringValue(), "the replay is not the first answer")
}

// An outer interceptor that adapts a response per caller (redaction) mutates
// the message the store shares between replays.
func TestHostileGRPCOuterInterceptorMutatesSharedReply(t *testing.T) {
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
	conn := rvStart(t, func(ctx context.Context, in *structpb.Struct) (*structpb.Struct, error) {
		return structpb.NewStruct(map[string]any{"charge": 1.0, "card": "4242"})
	}, []grpc.UnaryServerInterceptor{redact, idemgrpc.UnaryServerInterceptor(rvStore(t, idem.Options{}), idemgrpc.Options{})})
	admin := metadata.AppendToOutgoingContext(context.Background(), "role", "admin")
	first, err := rvCall(admin, conn, "k")
	require.NoError(t, err)
	require.Equal(t, "4242", first.Fields["card"].GetStringValue())
	_, err = rvCall(context.Background(), conn, "k") // a clerk's retry: redacted
	require.NoError(t, err)
	again, err := rvCall(admin, conn, "k")
	require.NoError(t, err)
	assert.Equal(t, "4242", again.Fields["card"].GetStringValue(), "the clerk's redaction was written into the remembered reply")
}

// The same, concurrently: a data race on the shared message (run with -race).
func TestHostileGRPCConcurrentReplayMutationRace(t *testing.T) {
	stamp := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		resp, err := handler(ctx, req)
		if s, ok := resp.(*structpb.Struct); ok {
			s.Fields["served_at"] = structpb.NewNumberValue(float64(time.Now().UnixNano())) // per-response stamp
		}
		return resp, err
	}
	conn := rvStart(t, func(ctx context.Context, in *structpb.Struct) (*structpb.Struct, error) {
		return structpb.NewStruct(map[string]any{"charge": 1.0})
	}, []grpc.UnaryServerInterceptor{stamp, idemgrpc.UnaryServerInterceptor(rvStore(t, idem.Options{}), idemgrpc.Options{})})
	_, err := rvCall(context.Background(), conn, "k")
	require.NoError(t, err)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 20 {
				_, _ = rvCall(context.Background(), conn, "k")
			}
		}()
	}
	wg.Wait()
}

// "-bin" metadata holds arbitrary bytes; through a Backend (JSON codec) the
// replay's bytes differ from the original.
func TestHostileGRPCBinaryHeaderThroughBackend(t *testing.T) {
	raw := string([]byte{0xff, 0x00, 0x80, 0x41})
	conn := rvStart(t, func(ctx context.Context, in *structpb.Struct) (*structpb.Struct, error) {
		_ = grpc.SetHeader(ctx, metadata.Pairs("trace-bin", raw))
		_ = grpc.SetTrailer(ctx, metadata.Pairs("sig-bin", raw))
		return structpb.NewStruct(map[string]any{"charge": 1.0})
	}, []grpc.UnaryServerInterceptor{idemgrpc.UnaryServerInterceptor(rvStore(t, idem.Options{Backend: idemtest.NewMemoryBackend()}), idemgrpc.Options{})})
	var h1, t1, h2, t2 metadata.MD
	_, err := rvCall(context.Background(), conn, "k", grpc.Header(&h1), grpc.Trailer(&t1))
	require.NoError(t, err)
	require.Equal(t, []string{raw}, h1.Get("trace-bin"))
	_, err = rvCall(context.Background(), conn, "k", grpc.Header(&h2), grpc.Trailer(&t2))
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

// A handler that returns (nil, nil) has run and succeeded: the key is
// released and the retry runs it again.
func TestHostileGRPCNilResponseRunsTwice(t *testing.T) {
	var runs atomic.Int32
	conn := rvStart(t, func(ctx context.Context, in *structpb.Struct) (*structpb.Struct, error) {
		runs.Add(1) // the side effect
		return nil, nil
	}, []grpc.UnaryServerInterceptor{idemgrpc.UnaryServerInterceptor(rvStore(t, idem.Options{}), idemgrpc.Options{})})
	_, err1 := rvCall(context.Background(), conn, "k")
	_, err2 := rvCall(context.Background(), conn, "k")
	t.Logf("first: %v; retry: %v", err1, err2)
	assert.Equal(t, int32(1), runs.Load(), "a handler that returned without error ran twice for one key")
}

// Held attacks: several key values, huge keys, scoping, client deadline
// shorter than Wait, client retries with one key.
func TestHostileGRPCHeld(t *testing.T) {
	var runs atomic.Int32
	gate := make(chan struct{})
	var gated atomic.Bool
	var keys sync.Map
	store := rvStore(t, idem.Options{})
	conn := rvStart(t, func(ctx context.Context, in *structpb.Struct) (*structpb.Struct, error) {
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
	_, err := rvCall(ctx, conn, "")
	assert.Equal(t, codes.InvalidArgument, status.Code(err))
	big := make([]byte, 300)
	for i := range big {
		big[i] = 'k'
	}
	_, err = rvCall(context.Background(), conn, string(big))
	assert.Equal(t, codes.InvalidArgument, status.Code(err))
	alice := metadata.AppendToOutgoingContext(context.Background(), "who", "alice")
	bob := metadata.AppendToOutgoingContext(context.Background(), "who", "bob")
	a, err := rvCall(alice, conn, "same")
	require.NoError(t, err)
	b, err := rvCall(bob, conn, "same")
	require.NoError(t, err)
	assert.Equal(t, "alice", a.Fields["who"].GetStringValue())
	assert.Equal(t, "bob", b.Fields["who"].GetStringValue())

	// Deadline shorter than Wait on a duplicate.
	gated.Store(true)
	before := runs.Load()
	done := make(chan error, 1)
	go func() { _, err := rvCall(alice, conn, "slow"); done <- err }()
	for runs.Load() == before {
		time.Sleep(time.Millisecond)
	}
	dctx, cancel := context.WithTimeout(alice, 50*time.Millisecond)
	_, err = rvCall(dctx, conn, "slow")
	cancel()
	assert.Equal(t, codes.DeadlineExceeded, status.Code(err))
	close(gate)
	require.NoError(t, <-done)
	gated.Store(false)
	r, err := rvCall(alice, conn, "slow")
	require.NoError(t, err)
	assert.Equal(t, float64(before+1), r.Fields["charge"].GetNumberValue())
	assert.Equal(t, before+1, runs.Load())
}

// The client interceptor: a RetryInfo longer than the caller's deadline is
// slept until the deadline instead of being given up at once; MaxAttempts
// is kept and the key is the same on every attempt.
func TestHostileGRPCClientRetry(t *testing.T) {
	var attempts atomic.Int32
	var seen sync.Map
	aborted := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		attempts.Add(1)
		md, _ := metadata.FromIncomingContext(ctx)
		seen.Store(first(md.Get(idemgrpc.KeyHeader)), true)
		st, _ := status.New(codes.Aborted, "in flight").WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(10 * time.Millisecond)})
		return nil, st.Err()
	}
	conn := rvStart(t, func(ctx context.Context, in *structpb.Struct) (*structpb.Struct, error) { return in, nil },
		[]grpc.UnaryServerInterceptor{aborted}, idemgrpc.UnaryClientInterceptor(idemgrpc.ClientOptions{MaxAttempts: 3}))
	_, err := rvCall(context.Background(), conn, "")
	assert.Equal(t, codes.Aborted, status.Code(err))
	assert.Equal(t, int32(3), attempts.Load())
	n := 0
	seen.Range(func(any, any) bool { n++; return true })
	assert.Equal(t, 1, n, "one key across attempts")
}

func TestHostileGRPCClientRetryInfoBeyondDeadline(t *testing.T) {
	aborted := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		st, _ := status.New(codes.Aborted, "in flight").WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(time.Hour)})
		return nil, st.Err()
	}
	conn := rvStart(t, func(ctx context.Context, in *structpb.Struct) (*structpb.Struct, error) { return in, nil },
		[]grpc.UnaryServerInterceptor{aborted}, idemgrpc.UnaryClientInterceptor(idemgrpc.ClientOptions{}))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	_, err := rvCall(ctx, conn, "")
	el := time.Since(start)
	t.Logf("returned %v after %v", err, el)
	assert.Less(t, el, 2500*time.Millisecond, "a delay past the deadline cannot succeed: give up at once, not at the deadline")
}
