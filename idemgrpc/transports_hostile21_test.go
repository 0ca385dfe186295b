package idemgrpc_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemgrpc"
	"github.com/stretchr/testify/assert"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"
)

// Caller A (deadline 100ms) claims the key; duplicate B (deadline 5s)
// coalesces onto A's execution. The work is bounded by A's deadline only,
// so B, with plenty of time left, gets A's deadline failure.
func TestH21CoalescedDuplicateInheritsFirstCallersDeadline(t *testing.T) {
	var runs atomic.Int32
	handler := func(ctx context.Context, req any) (any, error) {
		runs.Add(1)
		select {
		case <-time.After(300 * time.Millisecond):
			return structpb.NewStruct(map[string]any{"charge": 1.0})
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	intercept := idemgrpc.UnaryServerInterceptor(newStore(t, idem.Options{}), idemgrpc.Options{Wait: 5 * time.Second})
	in, _ := structpb.NewStruct(map[string]any{"amount": 1.0})
	info := &grpc.UnaryServerInfo{FullMethod: chargeMethod}
	md := metadata.Pairs(idemgrpc.KeyHeader, "k")
	actx, acancel := context.WithTimeout(metadata.NewIncomingContext(context.Background(), md), 100*time.Millisecond)
	defer acancel()
	bctx, bcancel := context.WithTimeout(metadata.NewIncomingContext(context.Background(), md), 5*time.Second)
	defer bcancel()
	aerr := make(chan error, 1)
	go func() { _, err := intercept(actx, in, info, handler); aerr <- err }()
	for runs.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	start := time.Now()
	out, berr := intercept(bctx, in, info, handler)
	t.Logf("A: %v; B after %v: out=%v err=%v (%T), runs=%d", <-aerr, time.Since(start), out, berr, berr, runs.Load())
	assert.NoError(t, berr, "B had 4.9s left but got A's deadline failure")
}
