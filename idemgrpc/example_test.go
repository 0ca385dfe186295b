package idemgrpc_test

import (
	"context"
	"log"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemgrpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
)

// The server half: unary methods run at most once per idempotency-key
// within the caller's scope; the client half sends one key on every retry.
// (See examples/payments -grpc for a story that runs.)
func Example() {
	store := idem.New[idemgrpc.Reply](idem.Options{}) // give it a Backend to share keys between servers
	defer store.Close()
	srv := grpc.NewServer(grpc.UnaryInterceptor(idemgrpc.UnaryServerInterceptor(store, idemgrpc.Options{
		Required: true,
		Scope: func(ctx context.Context) (string, error) { // the caller's identity, from your auth
			md, _ := metadata.FromIncomingContext(ctx)
			return md.Get("account")[0], nil
		},
	})))
	_ = srv // register services, then srv.Serve(listener)

	conn, err := grpc.NewClient("payments.internal:443",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor(idemgrpc.ClientOptions{})))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	// A key made with the order is sent on every attempt; without one the
	// interceptor makes one per call.
	ctx := idemgrpc.WithKey(context.Background(), "order-101")
	_ = ctx // pass ctx to the generated client's methods
}
