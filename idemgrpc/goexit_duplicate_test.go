package idemgrpc_test

import (
	"context"
	"log/slog"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemgrpc"
	"github.com/seed094d4201/idem/internal/faulttest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"
)

// A duplicate that waited on a handler which ended its goroutine
// (runtime.Goexit) is answered as for a handler that panicked, Internal,
// not Unavailable with "store unavailable" logged: the store is fine, the
// handler failed and its key is released.
func TestADuplicateOfAHandlerThatEndedItsGoroutineIsAnsweredAsForAPanic(t *testing.T) {
	var logs faulttest.LogBuffer
	intercept := idemgrpc.UnaryServerInterceptor(newStore(t, idem.Options{}),
		idemgrpc.Options{Unscoped: true, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	info := &grpc.UnaryServerInfo{FullMethod: "/idem.test.Payments/Charge"}
	req, err := structpb.NewStruct(map[string]any{"amount": 450})
	require.NoError(t, err)
	in := metadata.NewIncomingContext(context.Background(), metadata.Pairs(idemgrpc.KeyHeader, "k"))
	entered, gate := make(chan struct{}), make(chan struct{})
	go func() {
		_, _ = intercept(in, req, info, func(context.Context, any) (any, error) {
			close(entered)
			<-gate
			runtime.Goexit()
			return nil, nil
		})
	}()
	<-entered

	ctx := faulttest.NewWaiting(in)
	var ran atomic.Bool
	answered := make(chan error, 1)
	go func() {
		_, err := intercept(ctx, req, info, func(context.Context, any) (any, error) {
			ran.Store(true)
			return req, nil
		})
		answered <- err
	}()
	<-ctx.Asked
	close(gate)
	err = <-answered
	assert.False(t, ran.Load(), "the duplicate ran the handler: it did not wait")
	assert.Equal(t, codes.Internal, code(err), "%v", err)
	assert.NotContains(t, logs.String(), "store unavailable")
}
