package idemgrpc_test

import (
	"context"
	"testing"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemgrpc"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// In the transactional mode a handler's SendHeader is held, and behaves as
// gRPC's own does: a second SendHeader, or a SetHeader after it, fails.
// The headers go out once, with the answer: the committed reply's (and
// its replay's), or, for an error that rolled back, the error's, whose
// retry runs the handler afresh. A final error commits with the row, and
// its headers are replayed.
func TestInTxSendHeaderIsHeldAndSentOnceWithTheAnswer(t *testing.T) {
	for _, tc := range []struct {
		name     string
		fail     error
		code     codes.Code
		kept     bool // the row and the answer are committed
		replayed bool // the second call replays the first
	}{
		{"Reply", nil, codes.OK, true, true},
		{"FinalError", idem.Final(status.Error(codes.FailedPrecondition, "declined")), codes.FailedPrecondition, true, true},
		{"Error", status.Error(codes.Unavailable, "bank down"), codes.Unavailable, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eachTxDB(t, func(t *testing.T, db txDB) {
				var again, late error
				c := &txCharges{db: db, after: func(ctx context.Context, n int32) error {
					require.NoError(t, grpc.SendHeader(ctx, metadata.Pairs("sent", "early")))
					again = grpc.SendHeader(ctx, metadata.Pairs("sent", "again"))
					late = grpc.SetHeader(ctx, metadata.Pairs("late", "x"))
					return tc.fail
				}}
				conn := startTx(t, c, idemgrpc.Options{Logger: quietLogger()})
				_, h, tr, err := callTx(context.Background(), conn, "k1", "o1")
				require.Equal(t, tc.code, code(err), "%v", err)
				assert.Error(t, again, "a second SendHeader fails, as gRPC's does")
				assert.Error(t, late, "a SetHeader after SendHeader fails, as gRPC's does")
				assert.Equal(t, []string{"early"}, h.Get("sent"), "the header SendHeader sent, once")
				assert.Equal(t, []string{"ch_o1"}, h.Get("charge-id"))
				assert.Empty(t, h.Get("late"))
				assert.Equal(t, []string{"posted"}, tr.Get("ledger"))
				want := 0
				if tc.kept {
					want = 1
				}
				assert.Equal(t, want, db.rows(t, "o1"))

				_, h2, _, err := callTx(context.Background(), conn, "k1", "o1")
				require.Equal(t, tc.code, code(err), "%v", err)
				if tc.replayed {
					assert.Equal(t, []string{"true"}, h2.Get(idemgrpc.ReplayedHeader))
					assert.Equal(t, h.Get("sent"), h2.Get("sent"))
					assert.Equal(t, int32(1), c.runs.Load())
				} else {
					assert.Empty(t, h2.Get(idemgrpc.ReplayedHeader))
					assert.Equal(t, int32(2), c.runs.Load(), "the retry of a rolled-back call runs the handler")
				}
				assert.Equal(t, want, db.rows(t, "o1"))
			})
		})
	}
}
