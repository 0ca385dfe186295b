package idemgrpc_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemgrpc"
	"github.com/seed094d4201/idem/idemhttp"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// A key an operator settled with a final error (idem resolve -error,
// Store.Resolve with an error) is answered Internal, which no client
// retries, without the handler running: not Unavailable "retry with the
// same key", which UnaryClientInterceptor and gRPC's retry policies
// retried for the same answer until the record expired, each call logged
// at Error as a store failure.
func TestFinalErrorOutcomeIsNotAStoreFailure(t *testing.T) {
	b := idemtest.NewMemoryBackend()
	store := newStore(t, idem.Options{Backend: b})
	var logs bytes.Buffer
	p := &payments{}
	conn := startBuf(t, p, []grpc.UnaryServerInterceptor{idemgrpc.UnaryServerInterceptor(store, idemgrpc.Options{
		Unscoped: true,
		Logger:   slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
	})})

	// The interrupted claim of a call Charge(amount 5) under "refund-7"
	// (its owner died), which the operator settles with a final error.
	in, _ := structpb.NewStruct(map[string]any{"amount": 5.0})
	wire, err := proto.MarshalOptions{Deterministic: true}.Marshal(in)
	require.NoError(t, err)
	callFP := sha256.Sum256(append([]byte(chargeMethod+"\x00"), wire...))
	fp, err := idem.DefaultFingerprint(callFP[:]) // the payload the interceptor claims with
	require.NoError(t, err)
	ctx := context.Background()
	key := idemhttp.StoreKey("", "refund-7")
	_, claimed, err := b.Claim(ctx, backend.Record{Key: key, Fingerprint: fp, Token: "dead-owner", State: backend.StatePending},
		time.Now().Add(-time.Hour), time.Millisecond)
	require.NoError(t, err)
	require.True(t, claimed)
	require.NoError(t, store.Resolve(ctx, key, idemgrpc.Reply{}, errors.New("refunded by hand; card closed")))

	for range 2 {
		_, err := charge(ctx, conn, "refund-7", 5)
		assert.Equal(t, codes.Internal, code(err), "%v", err)
		assert.NotContains(t, err.Error(), "card closed", "the operator's message stays in the store")
	}
	assert.Zero(t, p.runs.Load())
	assert.Empty(t, logs.String(), "a client can ask again at will: nothing logged at Info or above")
}
