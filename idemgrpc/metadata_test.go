package idemgrpc_test

import (
	"context"
	"testing"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemgrpc"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"
)

// credentials are metadata keys a handler may set for its own caller that
// must never reach another call's replay.
var credentials = []string{"set-cookie", "authorization", "proxy-authorization", "proxy-authenticate",
	"www-authenticate", "authentication-info", "proxy-authentication-info", "cookie"}

// credentialHandler sets every credential key as a header and as a trailer,
// besides one header and one trailer that a replay keeps.
func credentialHandler(ctx context.Context, in *structpb.Struct) (*structpb.Struct, error) {
	header := metadata.Pairs("charge-id", "ch_1")
	trailer := metadata.Pairs("ledger", "posted")
	for _, k := range credentials {
		header.Append(k, "secret-of-the-first-caller")
		trailer.Append(k, "secret-of-the-first-caller")
	}
	_ = grpc.SetHeader(ctx, header)
	_ = grpc.SetTrailer(ctx, trailer)
	return structpb.NewStruct(map[string]any{"charge": 1.0})
}

// Credentials the handler set go to the first caller, and are never
// remembered: a replay, from memory or through a Backend, carries none.
func TestCredentialMetadataIsNotReplayed(t *testing.T) {
	for name, storeOpts := range map[string]idem.Options{"memory": {}, "backend": {Backend: idemtest.NewMemoryBackend()}} {
		t.Run(name, func(t *testing.T) {
			conn := startDo(t, credentialHandler, []grpc.UnaryServerInterceptor{idemgrpc.UnaryServerInterceptor(newStore(t, storeOpts), idemgrpc.Options{})})
			var h1, t1, h2, t2 metadata.MD
			_, err := callDo(context.Background(), conn, "k", grpc.Header(&h1), grpc.Trailer(&t1))
			require.NoError(t, err)
			for _, k := range credentials {
				assert.Equal(t, []string{"secret-of-the-first-caller"}, h1.Get(k), "the first call gets every header the handler set: %s", k)
				assert.Equal(t, []string{"secret-of-the-first-caller"}, t1.Get(k), "the first call gets every trailer the handler set: %s", k)
			}
			_, err = callDo(context.Background(), conn, "k", grpc.Header(&h2), grpc.Trailer(&t2))
			require.NoError(t, err)
			require.Equal(t, []string{"true"}, h2.Get(idemgrpc.ReplayedHeader))
			for _, k := range credentials {
				assert.Empty(t, h2.Get(k), "header %s replayed", k)
				assert.Empty(t, t2.Get(k), "trailer %s replayed", k)
			}
			assert.Equal(t, []string{"ch_1"}, h2.Get("charge-id"), "other headers are replayed")
			assert.Equal(t, []string{"posted"}, t2.Get("ledger"), "other trailers are replayed")
		})
	}
}

// StoredMetadata keeps only the keys it names (the never-stored ones not
// even then); SkipMetadata drops the keys it names; both without regard
// to case, and for headers and trailers alike.
func TestStoredAndSkipMetadata(t *testing.T) {
	for _, tc := range []struct {
		name      string
		opts      idemgrpc.Options
		header    []string // the handler's header keys a replay carries
		trailer   []string
		notHeader []string // and those it does not
		notTrailr []string
	}{
		{"stored", idemgrpc.Options{StoredMetadata: []string{"Charge-Id", "SET-COOKIE", "ledger"}},
			[]string{"charge-id"}, []string{"ledger"}, []string{"request-id", "set-cookie"}, []string{"request-id", "set-cookie"}},
		{"skip", idemgrpc.Options{SkipMetadata: []string{"Request-ID"}},
			[]string{"charge-id"}, []string{"ledger"}, []string{"request-id", "set-cookie"}, []string{"request-id", "set-cookie"}},
		{"stored-headers-only", idemgrpc.Options{StoredMetadata: []string{"charge-id"}},
			[]string{"charge-id"}, nil, []string{"request-id"}, []string{"ledger", "request-id"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conn := startDo(t, func(ctx context.Context, in *structpb.Struct) (*structpb.Struct, error) {
				_ = grpc.SetHeader(ctx, metadata.Pairs("charge-id", "ch_1", "request-id", "r1", "set-cookie", "s=1"))
				_ = grpc.SetTrailer(ctx, metadata.Pairs("ledger", "posted", "request-id", "r1", "set-cookie", "s=1"))
				return structpb.NewStruct(map[string]any{"charge": 1.0})
			}, []grpc.UnaryServerInterceptor{idemgrpc.UnaryServerInterceptor(newStore(t, idem.Options{}), tc.opts)})
			var h1, t1, h2, t2 metadata.MD
			_, err := callDo(context.Background(), conn, "k", grpc.Header(&h1), grpc.Trailer(&t1))
			require.NoError(t, err)
			for _, k := range []string{"charge-id", "request-id", "set-cookie"} {
				assert.NotEmpty(t, h1.Get(k), "the first call gets header %s", k)
			}
			for _, k := range []string{"ledger", "request-id", "set-cookie"} {
				assert.NotEmpty(t, t1.Get(k), "the first call gets trailer %s", k)
			}
			_, err = callDo(context.Background(), conn, "k", grpc.Header(&h2), grpc.Trailer(&t2))
			require.NoError(t, err)
			require.Equal(t, []string{"true"}, h2.Get(idemgrpc.ReplayedHeader))
			for _, k := range tc.header {
				assert.NotEmpty(t, h2.Get(k), "header %s replayed", k)
			}
			for _, k := range tc.trailer {
				assert.NotEmpty(t, t2.Get(k), "trailer %s replayed", k)
			}
			for _, k := range tc.notHeader {
				assert.Empty(t, h2.Get(k), "header %s not replayed", k)
			}
			for _, k := range tc.notTrailr {
				assert.Empty(t, t2.Get(k), "trailer %s not replayed", k)
			}
		})
	}
}
