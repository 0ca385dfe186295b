package idemgrpc_test

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"testing"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemgrpc"
	"github.com/seed094d4201/idem/internal/tenanttest"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
)

const tenantMethod = "/idem.test.Tenants/Charge"

type tenantKey struct{}

// tenantDesc is the suite's service: Charge counts a run and answers
// {"run": n}, setting credentials and plain fields in its header and
// trailer as tenanttest.Start describes.
func tenantDesc(runs *tenanttest.Runs) *grpc.ServiceDesc {
	charge := func(ctx context.Context, _ any) (any, error) {
		n := strconv.Itoa(runs.Next())
		_ = grpc.SetHeader(ctx, metadata.Pairs("set-cookie", "session="+n, "authorization", "Bearer t"+n,
			"authentication-info", "nextnonce="+n, "x-charge", "ch_"+n))
		_ = grpc.SetTrailer(ctx, metadata.Pairs("x-ledger", "posted-"+n, "authorization", "Bearer trailer-"+n,
			"proxy-authentication-info", "rspauth="+n))
		return structpb.NewStruct(map[string]any{"run": n})
	}
	return &grpc.ServiceDesc{
		ServiceName: "idem.test.Tenants",
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{
			MethodName: "Charge",
			Handler: func(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
				in := new(structpb.Struct)
				if err := dec(in); err != nil {
					return nil, err
				}
				return interceptor(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: tenantMethod}, charge)
			},
		}},
	}
}

// authenticate puts the caller's account, from its x-account metadata, in
// the context, as an authentication interceptor would.
func authenticate(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	if a := md.Get("x-account"); len(a) == 1 {
		ctx = context.WithValue(ctx, tenantKey{}, a[0])
	}
	return h(ctx, req)
}

func tenantScope(ctx context.Context) (string, error) {
	a, ok := ctx.Value(tenantKey{}).(string)
	if !ok {
		return "", errors.New("no account")
	}
	return a, nil
}

// TestTenantIsolation runs the tenant-isolation suite on gRPC: one store
// behind a scoped server and an open one, each on its own TCP listener.
func TestTenantIsolation(t *testing.T) {
	tenanttest.Run(t, func(t *testing.T, cfg tenanttest.Config, runs *tenanttest.Runs) tenanttest.Client {
		store := idem.New[idemgrpc.Reply](idem.Options{})
		t.Cleanup(func() { store.Close() })
		serve := func(chain ...grpc.UnaryServerInterceptor) *grpc.ClientConn {
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			srv := grpc.NewServer(grpc.ChainUnaryInterceptor(chain...))
			srv.RegisterService(tenantDesc(runs), nil)
			go srv.Serve(lis)
			t.Cleanup(srv.Stop)
			conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
			require.NoError(t, err)
			t.Cleanup(func() { conn.Close() })
			return conn
		}
		return grpcTenants{
			scoped: serve(authenticate, idemgrpc.UnaryServerInterceptor(store, idemgrpc.Options{Scope: tenantScope, ScopeQuota: cfg.Quota})),
			open:   serve(idemgrpc.UnaryServerInterceptor(store, idemgrpc.Options{Unscoped: true, ScopeQuota: cfg.Quota})),
		}
	})
}

type grpcTenants struct{ scoped, open *grpc.ClientConn }

func (c grpcTenants) Call(t *testing.T, route, tenant, key, body string) tenanttest.Answer {
	t.Helper()
	conn := c.scoped
	if route == tenanttest.Open {
		conn = c.open
	}
	ctx := idemgrpc.WithKey(context.Background(), key)
	if tenant != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "x-account", tenant)
	}
	in, err := structpb.NewStruct(map[string]any{"body": body})
	require.NoError(t, err)
	out := new(structpb.Struct)
	var header, trailer metadata.MD
	err = conn.Invoke(ctx, tenantMethod, in, out, grpc.Header(&header), grpc.Trailer(&trailer))
	a := tenanttest.Answer{Detail: status.Convert(err).String(), Replayed: len(header.Get(idemgrpc.ReplayedHeader)) > 0, Header: header, Trailer: trailer}
	switch st := status.Convert(err); {
	case err == nil:
		a.Outcome = tenanttest.Done
		a.Run, err = strconv.Atoi(out.Fields["run"].GetStringValue())
		require.NoError(t, err)
	case st.Code() == codes.InvalidArgument && strings.Contains(st.Message(), "different request"):
		a.Outcome = tenanttest.Mismatch
	case st.Code() == codes.ResourceExhausted:
		a.Outcome = tenanttest.OverQuota
	default:
		a.Outcome = tenanttest.Other
	}
	return a
}
