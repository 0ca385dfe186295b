package idemgrpc

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"math/rand/v2"
	"time"

	"github.com/seed094d4201/idem/internal/keyfield"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// ClientOptions configure UnaryClientInterceptor. Every zero field means
// the default it documents.
type ClientOptions struct {
	// Methods, if not nil, are the full method names given a key; others
	// pass straight through. Nil means every unary call.
	Methods []string

	// MaxAttempts bounds the attempts of one logical call, the first
	// included. Zero means 4; 1 means the interceptor only adds the key and
	// leaves retrying to gRPC's retry policy, which resends it (but gRPC
	// retries only attempts that failed before response headers arrived).
	MaxAttempts int

	// MinBackoff and MaxBackoff bound the jittered exponential wait between
	// attempts; a RetryInfo detail in the server's answer sets the wait.
	// An answer whose RetryInfo asks for more than MaxBackoff is returned,
	// not retried sooner than it asks, and so is one whose wait would end
	// past ctx's deadline. Zero means 100 milliseconds and 5 seconds.
	MinBackoff, MaxBackoff time.Duration
}

// WithKey returns ctx carrying key as the idempotency key of the calls made
// with it, in place of any key ctx carried, for a caller that made the key
// itself (with the order, say). The interceptor keeps it instead of making
// one. gRPC metadata carries printable ASCII only: a key with other bytes
// (valid for idem.CheckKey, "ü" say) makes the call fail on the client,
// before anything is sent, with codes.Internal.
func WithKey(ctx context.Context, key string) context.Context {
	md, ok := metadata.FromOutgoingContext(ctx) // a copy, with what was appended
	if !ok {
		md = metadata.MD{}
	}
	md.Set(KeyHeader, keyfield.Encode(key)) // a bare key with a comma would read as a list
	return metadata.NewOutgoingContext(ctx, md)
}

// UnaryClientInterceptor returns an interceptor that gives each logical
// unary call one idempotency key, unless ctx already carries one, and
// sends that key on every attempt. It retries, with the same key, only the
// answers that leave the outcome unknown or ask for a retry: Unavailable,
// Aborted and ResourceExhausted, waiting as their RetryInfo says (an
// answer that asks for more than MaxBackoff is returned: never retried
// sooner than asked) or with jittered backoff, within ctx. It never
// retries InvalidArgument, nor an error whose trailers mark it as a replay
// (ReplayedHeader): that is the key's remembered outcome, which every retry
// would meet again. (A mark in the headers alone is not enough: the
// connection may drop after them, and that error is no answer.) A key
// with a comma, or one that starts with a quote, is sent as an RFC 8941
// sf-string, as idemhttp sends it.
func UnaryClientInterceptor(opts ClientOptions) grpc.UnaryClientInterceptor {
	if opts.MaxAttempts <= 0 {
		opts.MaxAttempts = 4
	}
	if opts.MinBackoff <= 0 {
		opts.MinBackoff = 100 * time.Millisecond
	}
	if opts.MaxBackoff <= 0 {
		opts.MaxBackoff = 5 * time.Second
	}
	var methods map[string]bool
	if opts.Methods != nil {
		methods = make(map[string]bool, len(opts.Methods))
		for _, m := range opts.Methods {
			methods[m] = true
		}
	}
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, callOpts ...grpc.CallOption) error {
		if methods != nil && !methods[method] {
			return invoker(ctx, method, req, reply, cc, callOpts...)
		}
		if md, _ := metadata.FromOutgoingContext(ctx); len(md.Get(KeyHeader)) == 0 {
			ctx = WithKey(ctx, newKey())
		}
		backoff := opts.MinBackoff
		var trailer metadata.MD
		callOpts = append(callOpts[:len(callOpts):len(callOpts)], grpc.Trailer(&trailer))
		for attempt := 1; ; attempt++ {
			trailer = nil
			err := invoker(ctx, method, req, reply, cc, callOpts...)
			if err == nil || attempt >= opts.MaxAttempts || !retryable(err) || replayed(trailer) {
				// A replayed answer is the key's remembered outcome:
				// every retry with the key would meet it again.
				return err
			}
			wait := min(opts.MaxBackoff, backoff/2+rand.N(backoff/2+1))
			if d, ok := retryDelay(err); ok {
				if d > opts.MaxBackoff {
					// Sooner than the server asked would only meet the same
					// answer (and add to its load): the caller decides.
					return err
				}
				wait = d
			}
			if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) < wait {
				return err // no time left for another attempt
			}
			backoff = min(2*backoff, opts.MaxBackoff)
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return err
			case <-t.C:
			}
		}
	}
}

// replayed reports whether an error answer's trailers mark it as a replay.
// The trailers alone say so: they carry the status, so the mark there is
// the status's own. A replay's headers are marked too, but the connection
// may drop after them, and the error the client's transport then makes
// (Unavailable) leaves the outcome unknown, as any lost reply does.
func replayed(trailer metadata.MD) bool {
	return len(trailer.Get(ReplayedHeader)) > 0
}

// retryable reports whether err leaves the call's outcome unknown, or asks
// for a retry, so that sending it again with the same key is right.
func retryable(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.Aborted, codes.ResourceExhausted:
		return true
	}
	return false
}

// retryDelay returns the delay a RetryInfo detail in err asks for.
func retryDelay(err error) (time.Duration, bool) {
	for _, d := range status.Convert(err).Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok && ri.GetRetryDelay() != nil {
			return ri.GetRetryDelay().AsDuration(), true
		}
	}
	return 0, false
}

// newKey returns a random key: 128 bits, hex.
func newKey() string {
	var b [16]byte
	_, _ = crand.Read(b[:]) // crypto/rand.Read never fails on supported platforms
	return hex.EncodeToString(b[:])
}
