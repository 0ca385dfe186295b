package idemgrpc_test

import (
	"context"
	"testing"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemgrpc"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
)

// Keys that the key field treats specially, sent with WithKey through a
// real gRPC connection: each is one key on the server (its retry replays)
// and no two collide, a key and its quoted spelling included ("a" and a,
// " x" and x, a,b and "a,b").
func TestReviewSpecialKeysRoundTripThroughGRPC(t *testing.T) {
	p := &payments{}
	conn := startBuf(t, p, []grpc.UnaryServerInterceptor{idemgrpc.UnaryServerInterceptor(newStore(t, idem.Options{}), idemgrpc.Options{Unscoped: true})})
	keys := []string{"a", `"a"`, `"a`, `a"`, `\"a\"`, "a,b", `"a,b"`, `a\,b`, "x", " x", "x ", " x ", `\`, `\\`, `"`, `""`, ";p=1", `"k";p=1`, "a, b", " "}
	for i, key := range keys {
		first, err := charge(context.Background(), conn, key, 1)
		require.NoError(t, err, "key %q", key)
		again, err := charge(context.Background(), conn, key, 1)
		require.NoError(t, err, "key %q", key)
		assert.Equal(t, first.AsMap(), again.AsMap(), "key %q: the retry was not answered the first reply", key)
		assert.Equal(t, int32(i+1), p.runs.Load(), "key %q ran again, or shared another key's run", key)
	}
}
