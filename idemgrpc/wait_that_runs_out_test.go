package idemgrpc_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemgrpc"
	"github.com/seed094d4201/idem/idemtest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/structpb"
)

// A Wait that runs out before the claim is tried (a loaded server; here a
// Wait that has run out at once) is a wait that ran out: Aborted, to
// retry later, as idemhttp answers it 409. It was taken for the store's
// failure: "store unavailable" logged at Error, and Unavailable.
func TestWaitThatRunsOutBeforeTheClaimIsNotAStoreFailure(t *testing.T) {
	for _, mode := range []string{"memory", "durable"} {
		t.Run(mode, func(t *testing.T) {
			opts := idem.Options{}
			if mode == "durable" {
				opts.Backend = idemtest.NewMemoryBackend()
			}
			store := newStore(t, opts)
			var logs bytes.Buffer
			conn := startDo(t, func(ctx context.Context, in *structpb.Struct) (*structpb.Struct, error) { return in, nil },
				[]grpc.UnaryServerInterceptor{idemgrpc.UnaryServerInterceptor(store, idemgrpc.Options{Unscoped: true, Wait: time.Nanosecond, Logger: slog.New(slog.NewTextHandler(&logs, nil))})})
			_, err := callDo(context.Background(), conn, "k")
			if strings.Contains(logs.String(), "store unavailable") {
				t.Errorf("a wait bound that ran out is logged as the store's failure; answered %v", code(err))
			}
			if code(err) != codes.Aborted {
				t.Errorf("answered %v, want Aborted, as for any wait that ran out", code(err))
			}
		})
	}
}
