package idemgrpc

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/seed094d4201/idem"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
)

// The metadata keys idemgrpc reads and writes.
const (
	KeyHeader      = "idempotency-key"
	ReplayedHeader = "idempotent-replayed"
)

// A Reply is what the server interceptor remembers for a key and replays.
type Reply struct {
	Message []byte      // the response, an anypb.Any in wire form
	Header  metadata.MD // what the handler set with grpc.SetHeader
	Trailer metadata.MD // and with grpc.SetTrailer
	Code    codes.Code  // a final error's status code; OK for a response
	Error   string      // and its message
	Status  []byte      // and the whole google.rpc.Status in wire form, details included

	// While the Reply lives in memory (a store without a Backend, or the
	// calls that waited on this one), the response's type and wire form,
	// so that a replay need not unwrap Message.
	typ protoreflect.MessageType
	raw []byte
}

// replyJSON is a Reply in JSON, the store's default Codec: metadata values
// travel as bytes, since a -bin value is any bytes at all.
type replyJSON struct {
	Message []byte              `json:"message,omitempty"`
	Header  map[string][][]byte `json:"header,omitempty"`
	Trailer map[string][][]byte `json:"trailer,omitempty"`
	Code    codes.Code          `json:"code,omitempty"`
	Error   string              `json:"error,omitempty"`
	Status  []byte              `json:"status,omitempty"`
}

func (r Reply) MarshalJSON() ([]byte, error) {
	return json.Marshal(replyJSON{Message: r.Message, Header: mdBytes(r.Header), Trailer: mdBytes(r.Trailer), Code: r.Code, Error: r.Error, Status: r.Status})
}

func (r *Reply) UnmarshalJSON(data []byte) error {
	var j replyJSON
	if err := json.Unmarshal(data, &j); err != nil {
		return err
	}
	*r = Reply{Message: j.Message, Header: mdStrings(j.Header), Trailer: mdStrings(j.Trailer), Code: j.Code, Error: j.Error, Status: j.Status}
	return nil
}

func mdBytes(md metadata.MD) map[string][][]byte {
	if len(md) == 0 {
		return nil
	}
	m := make(map[string][][]byte, len(md))
	for k, vs := range md {
		for _, v := range vs {
			m[k] = append(m[k], []byte(v))
		}
	}
	return m
}

func mdStrings(m map[string][][]byte) metadata.MD {
	if len(m) == 0 {
		return nil
	}
	md := make(metadata.MD, len(m))
	for k, vs := range m {
		for _, v := range vs {
			md[k] = append(md[k], string(v))
		}
	}
	return md
}

// Options configure UnaryServerInterceptor. Every zero field means the
// default it documents.
type Options struct {
	// Methods, if not nil, are the full method names ("/pkg.Service/Method")
	// guarded; others pass straight through. Nil means every unary method.
	Methods []string

	// Required makes a guarded call without a key fail with
	// InvalidArgument. False lets it through unguarded.
	Required bool

	// Scope returns the client a call acts for, such as the authenticated
	// identity an earlier interceptor put in ctx, and the key is joined to
	// it: two clients never share an outcome. An error answers
	// Unauthenticated and runs nothing. Nil means one scope for every call,
	// which is right only when one client alone can reach the server.
	Scope func(ctx context.Context) (string, error)

	// Wait bounds how long a call whose key is in flight, here or on
	// another server sharing the store's Backend, waits for that outcome
	// before it is answered Aborted; a call whose own deadline comes first
	// is answered DeadlineExceeded. It bounds the whole claim, so it must
	// also cover a round trip to the Backend. Zero means 10 seconds.
	Wait time.Duration

	// RetryAfter is the delay an Aborted answer's RetryInfo suggests. Zero
	// means one second.
	RetryAfter time.Duration

	// Logger receives what cannot be told to the client: a handler panic,
	// an outcome the backend failed to record. Nil means slog.Default().
	Logger *slog.Logger
}

// UnaryServerInterceptor returns an interceptor that runs each guarded
// unary call at most once per key and replays its outcome, as the package
// documentation describes. Its store holds Replies; give it a Backend to
// share outcomes between servers.
func UnaryServerInterceptor(store *idem.Store[Reply], opts Options) grpc.UnaryServerInterceptor {
	if opts.Wait <= 0 {
		opts.Wait = 10 * time.Second
	}
	if opts.RetryAfter <= 0 {
		opts.RetryAfter = time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	var methods map[string]bool
	if opts.Methods != nil {
		methods = make(map[string]bool, len(opts.Methods))
		for _, m := range opts.Methods {
			methods[m] = true
		}
	}
	s := &server{store: store, opts: opts}
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if methods != nil && !methods[info.FullMethod] {
			return handler(ctx, req)
		}
		return s.serve(ctx, req, info, handler)
	}
}

type server struct {
	store *idem.Store[Reply]
	opts  Options
}

func (s *server) serve(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	keys := md.Get(KeyHeader)
	switch {
	case len(keys) == 0 && s.opts.Required:
		return nil, status.Error(codes.InvalidArgument, "this call needs an idempotency-key")
	case len(keys) == 0:
		return handler(ctx, req)
	case len(keys) > 1:
		return nil, status.Error(codes.InvalidArgument, "send one idempotency-key, not several")
	}
	key := keys[0]
	if err := idem.CheckKey(key); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "malformed idempotency-key: %v", err)
	}
	fp, err := fingerprint(info.FullMethod, req)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	storeKey := key
	if s.opts.Scope != nil {
		scope, err := s.opts.Scope(ctx)
		if err != nil {
			return nil, status.Errorf(codes.Unauthenticated, "the caller's scope could not be determined: %v", err)
		}
		storeKey = scopedKey(scope, key)
	}

	bctx, cancel := context.WithTimeout(ctx, s.opts.Wait)
	defer cancel()
	t, err := s.store.Begin(bctx, storeKey, fp[:])
	for err != nil && ctx.Err() == nil && ranOutOfTime(err) {
		// The execution this call waited on ended with its own caller's
		// deadline, and released the key: this caller has time left, so
		// it claims the key again, to run the work under its own.
		t, err = s.store.Begin(bctx, storeKey, fp[:])
	}
	if cerr := ctx.Err(); err != nil && cerr != nil {
		// The caller's own deadline (or cancellation) ended the wait, not
		// Wait: answer as gRPC does, so that the client hears the same
		// status whether its deadline or this answer reaches it first.
		return nil, status.FromContextError(cerr).Err()
	}
	if err != nil {
		return nil, s.refusal(err)
	}
	defer t.Release()
	if t.Replayed() {
		reply, err := t.Result()
		return s.replay(ctx, reply, err)
	}
	var own any // the handler's response, this call's to return
	reply, err := t.Do(func(work context.Context) (Reply, error) {
		if deadline, ok := ctx.Deadline(); ok {
			// The work is detached from the caller's cancellation, not
			// from its deadline: that stays the bound on the work, and on
			// whatever the handler calls with its context.
			var cancel context.CancelFunc
			work, cancel = context.WithDeadline(work, deadline)
			defer cancel()
		}
		rec := &recordingStream{ServerTransportStream: grpc.ServerTransportStreamFromContext(work)}
		resp, err := handler(grpc.NewContextWithServerTransportStream(work, rec), req)
		own = resp
		return rec.reply(resp, err)
	})
	var pe *idem.PanicError
	switch {
	case errors.As(err, &pe):
		s.opts.Logger.Error("idemgrpc: handler panicked; its key is released", "method", info.FullMethod, "panic", pe.Value, "stack", string(pe.Stack))
		return nil, status.Error(codes.Internal, "the call failed; it may be retried with the same key")
	case err != nil:
		var unstored *handlerError
		if errors.As(err, &unstored) {
			return nil, unstored.err // the handler's own error, not remembered
		}
		return nil, err
	}
	if reply.Code == codes.OK {
		return own, nil // the store keeps the response's bytes, not the message
	}
	return s.decode(reply)
}

// ranOutOfTime reports whether err is a shared execution's handler error
// that says its deadline passed.
func ranOutOfTime(err error) bool {
	var he *handlerError
	return errors.As(err, &he) && (errors.Is(he.err, context.DeadlineExceeded) || status.Code(he.err) == codes.DeadlineExceeded)
}

// handlerError carries a handler's error that is not final: the key is
// released and the caller gets the error as the handler returned it.
type handlerError struct{ err error }

func (e *handlerError) Error() string { return e.err.Error() }
func (e *handlerError) Unwrap() error { return e.err }

// refusal turns a failed Begin into the status the client sees.
func (s *server) refusal(err error) error {
	var unstored *handlerError
	switch {
	case errors.As(err, &unstored):
		return unstored.err // a shared execution's own error
	case errors.Is(err, idem.ErrPayloadMismatch):
		return status.Error(codes.InvalidArgument, "this idempotency-key was used with a different request")
	case errors.Is(err, idem.ErrInProgress):
		st := status.New(codes.Aborted, "a call with this idempotency-key is still being processed; retry with the same key")
		if d, derr := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(s.opts.RetryAfter)}); derr == nil {
			st = d
		}
		return st.Err()
	case errors.Is(err, idem.ErrOutcomeUnknown):
		return status.Error(codes.Internal, "a call with this idempotency-key was interrupted and its outcome is unknown; it needs an operator")
	case errors.Is(err, idem.ErrFull):
		s.opts.Logger.Debug("idemgrpc: store full; call refused", "err", err)
		return status.Error(codes.ResourceExhausted, "the server holds as many calls in flight as it can track; retry later with the same key")
	case errors.Is(err, idem.ErrInvalidKey):
		return status.Errorf(codes.InvalidArgument, "malformed idempotency-key: %v", err)
	}
	var pe *idem.PanicError
	if errors.As(err, &pe) {
		return status.Error(codes.Internal, "the call failed; it may be retried with the same key")
	}
	s.opts.Logger.Error("idemgrpc: store unavailable", "err", err)
	return status.Error(codes.Unavailable, "idempotency keys cannot be checked right now; retry with the same key")
}

// replay answers a call from a remembered reply, marked as a replay.
func (s *server) replay(ctx context.Context, reply Reply, err error) (any, error) {
	if err != nil {
		return nil, s.refusal(err)
	}
	header := metadata.Join(reply.Header, metadata.Pairs(ReplayedHeader, "true"))
	_ = grpc.SetHeader(ctx, header)
	if len(reply.Trailer) > 0 {
		_ = grpc.SetTrailer(ctx, reply.Trailer)
	}
	return s.decode(reply)
}

// decode turns a reply back into the handler's response, a message of its
// own for each caller, or its final status, details included.
func (s *server) decode(reply Reply) (any, error) {
	switch {
	case reply.Code != codes.OK && len(reply.Status) > 0:
		var sp spb.Status
		if err := proto.Unmarshal(reply.Status, &sp); err == nil {
			return nil, status.FromProto(&sp).Err()
		}
		return nil, status.Error(reply.Code, reply.Error)
	case reply.Code != codes.OK:
		return nil, status.Error(reply.Code, reply.Error)
	}
	typ, raw := reply.typ, reply.raw
	if typ == nil {
		var a anypb.Any
		if err := proto.Unmarshal(reply.Message, &a); err != nil {
			return nil, status.Errorf(codes.Internal, "idemgrpc: decoding the remembered response: %v", err)
		}
		var err error
		if typ, err = protoregistry.GlobalTypes.FindMessageByURL(a.GetTypeUrl()); err != nil {
			return nil, status.Errorf(codes.Internal, "idemgrpc: decoding the remembered response: %v", err)
		}
		raw = a.GetValue()
	}
	// Decoded into its fields, not passed on as bytes: an interceptor
	// outside this one may read or change the response (redact it, stamp
	// it), and must find it as the handler made it.
	m := typ.New().Interface()
	if err := proto.Unmarshal(raw, m); err != nil {
		return nil, status.Errorf(codes.Internal, "idemgrpc: decoding the remembered response: %v", err)
	}
	return m, nil
}

// fingerprint identifies a call: its method and its request message in
// deterministic wire form.
func fingerprint(method string, req any) ([sha256.Size]byte, error) {
	m, ok := req.(proto.Message)
	if !ok {
		return [sha256.Size]byte{}, fmt.Errorf("idemgrpc: request %T is not a protocol buffer message", req)
	}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		return [sha256.Size]byte{}, fmt.Errorf("idemgrpc: encoding the request to fingerprint it: %w", err)
	}
	h := sha256.New()
	h.Write([]byte(method))
	h.Write([]byte{0})
	h.Write(b)
	var fp [sha256.Size]byte
	h.Sum(fp[:0])
	return fp, nil
}

// scopedKey joins scope and key as idemhttp does, so that no other pair
// makes the same store key; one idem would refuse is replaced by its hash.
func scopedKey(scope, key string) string {
	k := strconv.Itoa(len(scope)) + ":" + scope + ":" + key
	if idem.CheckKey(k) == nil {
		return k
	}
	sum := sha256.Sum256([]byte(k))
	return fmt.Sprintf("sha256:%x", sum)
}
