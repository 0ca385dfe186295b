package idemgrpc_test

import (
	"bytes"
	"context"
	"log/slog"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemgrpc"
	"github.com/seed094d4201/idem/sqlite"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/structpb"
)

// A handler that ends its goroutine (runtime.Goexit) under Options.InTx
// is answered Internal, as a panic is, as it is without InTx, its writes
// rolled back and its key released. It was taken for a commit that
// failed (Unavailable, logged "did not commit").
func TestHandlerGoexitInTxIsAnsweredAsAPanic(t *testing.T) {
	db, err := sqlite.Open(filepath.Join(t.TempDir(), "x.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	b, err := sqlite.New(context.Background(), db, sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	store := newStore(t, idem.Options{Backend: b})
	var logs bytes.Buffer
	runs := 0
	conn := startDo(t, func(ctx context.Context, in *structpb.Struct) (*structpb.Struct, error) {
		runs++
		if runs == 1 {
			runtime.Goexit()
		}
		return in, nil
	}, []grpc.UnaryServerInterceptor{idemgrpc.UnaryServerInterceptor(store, idemgrpc.Options{InTx: sqlite.InTx[idemgrpc.Reply], Logger: slog.New(slog.NewTextHandler(&logs, nil))})})
	_, err = callDo(context.Background(), conn, "k")
	if code(err) != codes.Internal {
		t.Errorf("a handler that called runtime.Goexit under InTx answered %v, want Internal as for a panic", code(err))
	}
	if !strings.Contains(logs.String(), "runtime.Goexit") || strings.Contains(logs.String(), "did not commit") {
		t.Errorf("logged as a failed commit")
	}
	if _, err := callDo(context.Background(), conn, "k"); err != nil {
		t.Errorf("retry: %v", err)
	}
}
