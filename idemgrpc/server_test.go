package idemgrpc_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
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

func guard(t *testing.T, opts idemgrpc.Options, storeOpts idem.Options) []grpc.UnaryServerInterceptor {
	return []grpc.UnaryServerInterceptor{idemgrpc.UnaryServerInterceptor(newStore(t, storeOpts), opts)}
}

func TestOneExecutionFor100ConcurrentCalls(t *testing.T) {
	p := &payments{entered: make(chan struct{}, 1), gate: make(chan struct{})}
	// MaxWaiters -1: every duplicate may wait, so all 100 are coalesced
	// (the default cap is tested in limits_test.go).
	conn := startBuf(t, p, guard(t, idemgrpc.Options{Unscoped: true, Wait: time.Minute, MaxWaiters: -1}, idem.Options{}))
	const calls = 100
	var wg sync.WaitGroup
	results := make(chan float64, calls)
	for range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, err := charge(context.Background(), conn, "one-key", 450)
			if assert.NoError(t, err) {
				results <- out.Fields["charge"].GetNumberValue()
			}
		}()
	}
	<-p.entered
	close(p.gate) // the waiters are parked on the claim or still arriving: either way they replay
	wg.Wait()
	close(results)
	for n := range results {
		assert.Equal(t, float64(1), n, "every call gets the one execution's response")
	}
	assert.Equal(t, int32(1), p.runs.Load())
}

func TestReplayCarriesResponseHeadersAndTrailers(t *testing.T) {
	p := &payments{}
	conn := startBuf(t, p, guard(t, idemgrpc.Options{}, idem.Options{}))
	first, err := charge(context.Background(), conn, "k", 450)
	require.NoError(t, err)
	var header, trailer metadata.MD
	again, err := charge(context.Background(), conn, "k", 450, grpc.Header(&header), grpc.Trailer(&trailer))
	require.NoError(t, err)
	assert.Equal(t, first.AsMap(), again.AsMap())
	assert.Equal(t, []string{"true"}, header.Get(idemgrpc.ReplayedHeader))
	assert.Equal(t, []string{"ch_1"}, header.Get("charge-id"))
	assert.Equal(t, []string{"posted"}, trailer.Get("ledger"))
	assert.Equal(t, int32(1), p.runs.Load())
}

func TestMismatchMissingAndMalformedKeys(t *testing.T) {
	p := &payments{}
	conn := startBuf(t, p, guard(t, idemgrpc.Options{Required: true}, idem.Options{}))
	_, err := charge(context.Background(), conn, "k", 450)
	require.NoError(t, err)
	_, err = charge(context.Background(), conn, "k", 900)
	assert.Equal(t, codes.InvalidArgument, code(err), "the key with a different request")
	_, err = charge(context.Background(), conn, "", 450)
	assert.Equal(t, codes.InvalidArgument, code(err), "a missing key where one is required")
	_, err = charge(context.Background(), conn, strings.Repeat("k", 300), 450)
	assert.Equal(t, codes.InvalidArgument, code(err), "a malformed key")
	assert.Equal(t, int32(1), p.runs.Load())
}

func TestStoreDownIsUnavailable(t *testing.T) {
	down := idemtest.Faulty{Backend: idemtest.NewMemoryBackend(), Fail: func(string) error { return errDown }}
	p := &payments{}
	conn := startBuf(t, p, guard(t, idemgrpc.Options{}, idem.Options{Backend: down, SettleTimeout: 10 * time.Millisecond}))
	_, err := charge(context.Background(), conn, "k", 450)
	assert.Equal(t, codes.Unavailable, code(err))
	assert.Zero(t, p.runs.Load(), "fail closed: nothing runs")
}

func TestInFlightIsAbortedWithRetryInfo(t *testing.T) {
	p := &payments{entered: make(chan struct{}, 1), gate: make(chan struct{})}
	conn := startBuf(t, p, guard(t, idemgrpc.Options{Wait: 50 * time.Millisecond, RetryAfter: 2 * time.Second}, idem.Options{}))
	first := make(chan error, 1)
	go func() {
		_, err := charge(context.Background(), conn, "k", 450)
		first <- err
	}()
	<-p.entered
	_, err := charge(context.Background(), conn, "k", 450)
	require.Equal(t, codes.Aborted, code(err))
	var delay time.Duration
	for _, d := range status.Convert(err).Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			delay = ri.GetRetryDelay().AsDuration()
		}
	}
	assert.Equal(t, 2*time.Second, delay)
	close(p.gate)
	require.NoError(t, <-first)
}

// A duplicate whose own deadline ends before Wait is answered
// DeadlineExceeded, the status its client reports when its own timer
// fires first, so the two cannot disagree. The interceptor is called
// directly: over a connection the client's timer could answer first.
func TestDuplicateWhoseDeadlineEndsFirstIsDeadlineExceeded(t *testing.T) {
	intercept := idemgrpc.UnaryServerInterceptor(newStore(t, idem.Options{}), idemgrpc.Options{Wait: time.Hour})
	info := &grpc.UnaryServerInfo{FullMethod: "/idem.test.Payments/Charge"}
	req, err := structpb.NewStruct(map[string]any{"amount": 450})
	require.NoError(t, err)
	in := metadata.NewIncomingContext(context.Background(), metadata.Pairs(idemgrpc.KeyHeader, "k"))
	entered, gate := make(chan struct{}), make(chan struct{})
	first := make(chan error, 1)
	go func() {
		_, err := intercept(in, req, info, func(context.Context, any) (any, error) {
			close(entered)
			<-gate
			return req, nil
		})
		first <- err
	}()
	<-entered
	for _, end := range []struct {
		ctx  func() (context.Context, context.CancelFunc)
		want codes.Code
	}{
		{func() (context.Context, context.CancelFunc) { return context.WithTimeout(in, 10*time.Millisecond) }, codes.DeadlineExceeded},
		{func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(in)
			time.AfterFunc(10*time.Millisecond, cancel)
			return ctx, cancel
		}, codes.Canceled},
	} {
		ctx, cancel := end.ctx()
		_, err := intercept(ctx, req, info, func(context.Context, any) (any, error) {
			t.Error("a duplicate ran the handler")
			return req, nil
		})
		cancel()
		assert.Equal(t, end.want, code(err), "%v", err)
	}
	close(gate)
	require.NoError(t, <-first)
}

func TestFinalErrorsAreRememberedWithTheirCode(t *testing.T) {
	p := &payments{fail: func(n int32) error {
		if n == 1 {
			return idem.Final(status.Error(codes.FailedPrecondition, "card declined"))
		}
		return nil
	}}
	conn := startBuf(t, p, guard(t, idemgrpc.Options{}, idem.Options{}))
	_, err := charge(context.Background(), conn, "k", 450)
	assert.Equal(t, codes.FailedPrecondition, code(err))
	_, err = charge(context.Background(), conn, "k", 450)
	assert.Equal(t, codes.FailedPrecondition, code(err), "a final error replays with its code")
	assert.Equal(t, "card declined", status.Convert(err).Message())
	assert.Equal(t, int32(1), p.runs.Load())
}

func TestOtherErrorsReleaseTheKey(t *testing.T) {
	p := &payments{fail: func(n int32) error {
		if n == 1 {
			return status.Error(codes.Internal, "bank timeout")
		}
		return nil
	}}
	conn := startBuf(t, p, guard(t, idemgrpc.Options{}, idem.Options{}))
	_, err := charge(context.Background(), conn, "k", 450)
	assert.Equal(t, codes.Internal, code(err), "the handler's own status")
	out, err := charge(context.Background(), conn, "k", 450)
	require.NoError(t, err, "the retry runs again")
	assert.Equal(t, float64(2), out.Fields["charge"].GetNumberValue())
}

func TestHandlerPanicIsInternalAndReleases(t *testing.T) {
	p := &payments{fail: func(n int32) error {
		if n == 1 {
			panic("handler bug")
		}
		return nil
	}}
	conn := startBuf(t, p, guard(t, idemgrpc.Options{}, idem.Options{}))
	_, err := charge(context.Background(), conn, "k", 450)
	assert.Equal(t, codes.Internal, code(err))
	_, err = charge(context.Background(), conn, "k", 450)
	assert.NoError(t, err)
}

type identity struct{}

func TestScopesAreIsolated(t *testing.T) {
	p := &payments{}
	auth := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		return handler(context.WithValue(ctx, identity{}, md.Get("account")[0]), req)
	}
	scope := func(ctx context.Context) (string, error) {
		s, ok := ctx.Value(identity{}).(string)
		if !ok {
			return "", errors.New("no identity")
		}
		return s, nil
	}
	conn := startBuf(t, p, []grpc.UnaryServerInterceptor{auth, idemgrpc.UnaryServerInterceptor(newStore(t, idem.Options{}), idemgrpc.Options{Scope: scope})})
	as := func(account string) context.Context {
		return metadata.AppendToOutgoingContext(context.Background(), "account", account)
	}
	a, err := charge(as("alice"), conn, "same", 450)
	require.NoError(t, err)
	b, err := charge(as("bob"), conn, "same", 450)
	require.NoError(t, err)
	assert.NotEqual(t, a.AsMap(), b.AsMap(), "each account runs once")
	assert.Equal(t, int32(2), p.runs.Load())
}

// Over a real TCP listener, as in production.
func TestOverTCP(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &payments{}
	conn := start(t, lis, nil, p, guard(t, idemgrpc.Options{}, idem.Options{}))
	first, err := charge(context.Background(), conn, "k", 450)
	require.NoError(t, err)
	again, err := charge(context.Background(), conn, "k", 450)
	require.NoError(t, err)
	assert.Equal(t, first.AsMap(), again.AsMap())
	assert.Equal(t, int32(1), p.runs.Load())
}
