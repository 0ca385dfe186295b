package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/bolt"
	"github.com/seed094d4201/idem/idemgrpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
)

// The gRPC twin of the story: the same payment service as a unary method,
// guarded by idemgrpc, and a client whose interceptor resends one key when
// the first reply is lost. There is no generated code: the method takes and
// returns a google.protobuf.Struct.
const chargeMethod = "/payments.Payments/Charge"

// grpcPayments is the service: a ledger, charged once per call that runs.
type grpcPayments struct {
	mu     sync.Mutex
	ledger []Charge // guarded by mu
}

func (p *grpcPayments) charge(ctx context.Context, in *structpb.Struct) (*structpb.Struct, error) {
	order, amount := int(in.Fields["order"].GetNumberValue()), int(in.Fields["amount"].GetNumberValue())
	if order <= 0 || amount <= 0 {
		return nil, idem.Final(status.Error(codes.InvalidArgument, "want order and amount"))
	}
	p.mu.Lock()
	c := Charge{ID: len(p.ledger) + 1, Order: order, Amount: amount}
	p.ledger = append(p.ledger, c)
	p.mu.Unlock()
	return structpb.NewStruct(map[string]any{"charge": float64(c.ID), "order": float64(order), "amount": float64(amount)})
}

var paymentsDesc = grpc.ServiceDesc{
	ServiceName: "payments.Payments",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Charge",
		Handler: func(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
			in := new(structpb.Struct)
			if err := dec(in); err != nil {
				return nil, err
			}
			handler := func(ctx context.Context, req any) (any, error) {
				return srv.(*grpcPayments).charge(ctx, req.(*structpb.Struct))
			}
			return interceptor(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: chargeMethod}, handler)
		},
	}},
}

// loseFirstReply lets the first call run, then drops its reply on the way
// back, as a broken connection does.
type loseFirstReply struct{ seen atomic.Int32 }

func (l *loseFirstReply) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	resp, err := handler(ctx, req)
	if l.seen.Add(1) == 1 {
		return nil, status.Error(codes.Unavailable, "connection reset: the reply was lost")
	}
	return resp, err
}

func runGRPC(w io.Writer) error {
	dir, err := os.MkdirTemp("", "payments")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	b, err := bolt.Open(filepath.Join(dir, "keys.db"), nil)
	if err != nil {
		return err
	}
	defer b.Close()
	keys := idem.New[idemgrpc.Reply](idem.Options{Backend: b})
	defer keys.Close()

	svc, lossy := &grpcPayments{}, &loseFirstReply{}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(
		lossy.intercept,
		idemgrpc.UnaryServerInterceptor(keys, idemgrpc.Options{
			Required: true,
			// One tenant must never see another's stored replies. A real
			// service takes the account from its authentication.
			Scope: func(ctx context.Context) (string, error) {
				md, _ := metadata.FromIncomingContext(ctx)
				if a := md.Get("account"); len(a) == 1 {
					return a[0], nil
				}
				return "", errors.New("no account")
			},
		}),
	))
	srv.RegisterService(&paymentsDesc, svc)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Stop()

	conn, err := grpc.NewClient(ln.Addr().String(),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor(idemgrpc.ClientOptions{MinBackoff: 10 * time.Millisecond})))
	if err != nil {
		return err
	}
	defer conn.Close()

	fmt.Fprintln(w, "Paying three orders over gRPC; the first reply is lost:")
	for _, o := range []struct{ order, amount int }{{101, 450}, {102, 990}, {103, 120}} {
		ctx := metadata.AppendToOutgoingContext(context.Background(), "account", "shop-7")
		in, err := structpb.NewStruct(map[string]any{"order": float64(o.order), "amount": float64(o.amount)})
		if err != nil {
			return err
		}
		out := new(structpb.Struct)
		var header metadata.MD
		if err := conn.Invoke(ctx, chargeMethod, in, out, grpc.Header(&header)); err != nil {
			return err
		}
		note := ""
		if len(header.Get(idemgrpc.ReplayedHeader)) > 0 {
			note = " (a retry after the lost reply, answered from the stored reply)"
		}
		fmt.Fprintf(w, "  order %d: charge %d%s\n", o.order, int(out.Fields["charge"].GetNumberValue()), note)
	}
	svc.mu.Lock()
	defer svc.mu.Unlock()
	fmt.Fprintln(w, "The ledger:")
	perOrder := make(map[int]int)
	for _, c := range svc.ledger {
		fmt.Fprintf(w, "  charge %d: order %d, %d rupees\n", c.ID, c.Order, c.Amount)
		perOrder[c.Order]++
	}
	once := len(perOrder) == 3
	for _, n := range perOrder {
		once = once && n == 1
	}
	fmt.Fprintf(w, "One charge per order: %v\n", once)
	if !once {
		return errors.New("an order was charged twice")
	}
	return nil
}
