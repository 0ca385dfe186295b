package idemgrpc_test

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemgrpc"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/structpb"
)

const chargeMethod = "/idem.test.Payments/Charge"

// payments is the test service: Charge answers {"charge": n, "amount": ...}
// and counts its runs. gate, if set, holds each call until it is closed;
// fail, if set, is returned instead.
type payments struct {
	runs    atomic.Int32
	entered chan struct{}
	gate    chan struct{}
	fail    func(n int32) error
	quiet   bool // sets no headers or trailers
}

func (p *payments) Charge(ctx context.Context, in *structpb.Struct) (*structpb.Struct, error) {
	n := p.runs.Add(1)
	if p.entered != nil {
		select {
		case p.entered <- struct{}{}:
		default:
		}
	}
	if p.gate != nil {
		<-p.gate
	}
	if p.fail != nil {
		if err := p.fail(n); err != nil {
			return nil, err
		}
	}
	if !p.quiet {
		_ = grpc.SetHeader(ctx, metadata.Pairs("charge-id", "ch_1"))
		_ = grpc.SetTrailer(ctx, metadata.Pairs("ledger", "posted"))
	}
	return structpb.NewStruct(map[string]any{"charge": float64(n), "amount": in.Fields["amount"].GetNumberValue()})
}

// serviceDesc registers payments without generated code.
var serviceDesc = grpc.ServiceDesc{
	ServiceName: "idem.test.Payments",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Charge",
		Handler: func(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
			in := new(structpb.Struct)
			if err := dec(in); err != nil {
				return nil, err
			}
			handler := func(ctx context.Context, req any) (any, error) {
				return srv.(*payments).Charge(ctx, req.(*structpb.Struct))
			}
			if interceptor == nil {
				return handler(ctx, in)
			}
			return interceptor(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: chargeMethod}, handler)
		},
	}},
}

// start serves p on lis with the interceptors, and returns a client
// connection with the client interceptors.
func start(t *testing.T, lis net.Listener, dial func(context.Context, string) (net.Conn, error), p *payments, server []grpc.UnaryServerInterceptor, client ...grpc.UnaryClientInterceptor) *grpc.ClientConn {
	t.Helper()
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(server...))
	srv.RegisterService(&serviceDesc, p)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	target := lis.Addr().String()
	opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithChainUnaryInterceptor(client...),
		// gRPC's own retry policy, for the interceptor with MaxAttempts 1.
		grpc.WithDefaultServiceConfig(`{"methodConfig": [{"name": [{"service": "idem.test.Payments"}],
			"retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.01s", "maxBackoff": "0.01s", "backoffMultiplier": 1,
				"retryableStatusCodes": ["UNAVAILABLE"]}}]}`)}
	if dial != nil {
		target = "passthrough:///bufnet"
		opts = append(opts, grpc.WithContextDialer(dial))
	}
	conn, err := grpc.NewClient(target, opts...)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return conn
}

// startBuf is start over an in-memory bufconn listener.
func startBuf(t *testing.T, p *payments, server []grpc.UnaryServerInterceptor, client ...grpc.UnaryClientInterceptor) *grpc.ClientConn {
	lis := bufconn.Listen(1 << 20)
	return start(t, lis, func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }, p, server, client...)
}

func newStore(t *testing.T, opts idem.Options) *idem.Store[idemgrpc.Reply] {
	s := idem.New[idemgrpc.Reply](opts)
	t.Cleanup(func() { s.Close() })
	return s
}

// charge calls Charge with amount under key (none if empty).
func charge(ctx context.Context, conn *grpc.ClientConn, key string, amount float64, opts ...grpc.CallOption) (*structpb.Struct, error) {
	if key != "" {
		ctx = idemgrpc.WithKey(ctx, key)
	}
	in, _ := structpb.NewStruct(map[string]any{"amount": amount})
	out := new(structpb.Struct)
	err := conn.Invoke(ctx, chargeMethod, in, out, opts...)
	return out, err
}

func code(err error) codes.Code { return status.Code(err) }

var errDown = errors.New("database unreachable")

// doMethod is the one method of the service startDo serves, whose handler
// the test gives.
const doMethod = "/idem.test.Svc/Do"

// doHandler answers doMethod.
type doHandler func(ctx context.Context, in *structpb.Struct) (*structpb.Struct, error)

// startDo serves doMethod with h behind the server interceptors, over an
// in-memory connection, and returns a client connection through the client
// interceptors; both end with the test.
func startDo(t *testing.T, h doHandler, server []grpc.UnaryServerInterceptor, client ...grpc.UnaryClientInterceptor) *grpc.ClientConn {
	t.Helper()
	desc := grpc.ServiceDesc{
		ServiceName: "idem.test.Svc",
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
				return interceptor(ctx, in, &grpc.UnaryServerInfo{FullMethod: doMethod}, handler)
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

// callDo calls doMethod under key (none if empty).
func callDo(ctx context.Context, conn *grpc.ClientConn, key string, opts ...grpc.CallOption) (*structpb.Struct, error) {
	if key != "" {
		ctx = idemgrpc.WithKey(ctx, key)
	}
	in, _ := structpb.NewStruct(map[string]any{"amount": 450.0})
	out := new(structpb.Struct)
	err := conn.Invoke(ctx, doMethod, in, out, opts...)
	return out, err
}
