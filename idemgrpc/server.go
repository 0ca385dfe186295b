package idemgrpc

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/internal/keyfield"
	"github.com/seed094d4201/idem/internal/limit"
	"github.com/seed094d4201/idem/internal/waitctx"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// The metadata keys idemgrpc reads and writes.
const (
	// KeyHeader carries the idempotency key of a call.
	KeyHeader = "idempotency-key"

	// ReplayedHeader is set, to "true", on every replay: the handler did
	// not run for this call; its answer is a remembered one. It is in the
	// headers, and for a replayed error in the trailers too, beside the
	// status it marks.
	ReplayedHeader = "idempotent-replayed"

	// BodyOmittedHeader is set, to "true", beside ReplayedHeader on a
	// replay of a call whose response message was not remembered, being
	// larger than Options.MaxStoredReply. The handler ran and succeeded,
	// once; the replay carries its remembered headers and trailers and
	// the status AlreadyExists, whose message gives the size of the
	// response it omits. A client must not run the call again (with a new
	// key) to get the message; it can read what the call made instead.
	//
	// AlreadyExists is what a server without idempotency keys answers a
	// create it has already done: the work is done, ask for its result.
	// It is not a code UnaryClientInterceptor retries (Unavailable,
	// Aborted, ResourceExhausted), nor one a retry policy lists by
	// habit. OK with an empty message would pass for the whole answer,
	// FailedPrecondition, Internal or DataLoss would say that the call
	// failed or that the server is broken, and none of that is so.
	BodyOmittedHeader = "idempotent-body-omitted"
)

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
	// Unauthenticated with a fixed message and runs nothing; the error
	// itself, which may tell how credentials are checked, goes to Logger
	// at Debug, never to the client. An empty scope with a nil error
	// answers Internal and runs nothing: it is what a Scope returns when
	// authentication did not run, and would put every such caller in one
	// scope. Nil means one scope for every call, which is right only when
	// one client alone can reach the server; say so with Unscoped, or the
	// interceptor warns once when it is made. Either way a scoped server's
	// keys and an unscoped one's live apart (idemhttp.StoreKey's form, the
	// unscoped under the empty scope), so one store can serve both.
	Scope func(ctx context.Context) (string, error)

	// Unscoped declares that one client alone reaches the server, so that
	// a nil Scope is a choice rather than an oversight, and is not warned
	// about. It is ignored, with an error logged once, when Scope is set.
	Unscoped bool

	// ScopeQuota bounds the new keys one scope may make within
	// ScopeQuotaWindow: past it, a call with a new key is answered
	// ResourceExhausted with RetryInfo, while the scope's known keys still
	// replay and other scopes are untouched. A key counts from its claim
	// until its window passes, unless the handler's outcome is not
	// remembered: that key is given back. It is counted by this process;
	// with a Backend shared by N servers, a scope may make up to N times
	// the quota in the backend. A call over the quota still costs a claim
	// and a release in the Backend: it bounds the keys kept, not the call
	// rate. The store's MaxKeys is shared by every scope: without a quota
	// one scope can fill it for all, so on a server with many clients set
	// one. Zero or negative means no quota.
	ScopeQuota int

	// ScopeQuotaWindow is the window ScopeQuota counts over; set it to the
	// store's TTL. Zero means 24 hours, the store's default TTL.
	ScopeQuotaWindow time.Duration

	// MaxWaiters bounds the calls with one key held at once in this
	// process besides the one that runs it: duplicates waiting for its
	// outcome, and replays of a finished key still being read from the
	// Backend. One more is answered Aborted with RetryInfo at once. Zero
	// means 8; negative means no bound.
	MaxWaiters int

	// Wait bounds how long a call whose key is in flight, here or on
	// another server sharing the store's Backend, waits for that outcome
	// before it is answered Aborted; a call whose own deadline comes first
	// is answered DeadlineExceeded. It bounds the whole claim, so it must
	// also cover a round trip to the Backend. Zero or less means 10 seconds.
	Wait time.Duration

	// RetryAfter is the delay an Aborted answer's RetryInfo suggests. Zero
	// means one second.
	RetryAfter time.Duration

	// StoredMetadata, if not nil, are the only header and trailer keys
	// remembered and replayed with the response. Nil means every key the
	// handler set, but those in SkipMetadata. Either way some keys are
	// never stored: credentials (set-cookie, cookie, authorization,
	// proxy-authorization, www-authenticate, proxy-authenticate,
	// authentication-info, proxy-authentication-info), HTTP/2 connection
	// headers (connection, keep-alive, proxy-connection, te, trailer,
	// transfer-encoding, upgrade), what gRPC makes for each response
	// (content-type, content-length, user-agent, pseudo-headers such as
	// :status, and every key beginning with grpc-, grpc-retry-pushback-ms
	// included, which speaks of one attempt), and idempotent-replayed and
	// idempotent-body-omitted, which a replay sets itself: a replay
	// carries credentials of no one. Keys are compared without regard to
	// case. The call that runs the handler sends its client everything the
	// handler set; only what is remembered is filtered.
	StoredMetadata []string

	// SkipMetadata are header and trailer keys never remembered, besides
	// those above, such as a per-call x-request-id. Nil means none.
	SkipMetadata []string

	// MaxStoredReply bounds the response message remembered, in bytes of
	// its wire form. A larger response is delivered whole to the call that
	// ran the handler, and the call is remembered as done without it: the
	// handler is not run again for its key, and every other call with the
	// key, the ones that waited on it included, is answered AlreadyExists
	// with the remembered metadata and BodyOmittedHeader. Zero or negative
	// means 1 MiB.
	MaxStoredReply int

	// InTx, if set, is the transactional mode: each guarded call's handler
	// runs in a transaction of the store's database that also claims its
	// key, and its rows, its key and its reply (the response message, or
	// a final error, with the headers and trailers that are remembered)
	// commit together before the answer is sent. Set it to the InTx of
	// the store's Backend package, such as sqlite.InTx[idemgrpc.Reply]
	// (postgres and mysql have theirs), and have the handler write
	// through the transaction that package's TxFromContext finds in its
	// ctx. A crash at any instant leaves either nothing (the retry runs
	// the handler afresh) or everything (the retry replays the reply);
	// without InTx, a crash between the handler's own commit and its
	// reply being recorded leaves the key interrupted, answered Internal
	// until an operator settles it. See "Transactional mode" in the
	// package doc for what the handler must not do there. Nil means the
	// handler runs outside any transaction of the interceptor's.
	InTx func(ctx context.Context, store *idem.Store[Reply], key string, payload any, fn func(ctx context.Context) (Reply, error)) (Reply, error)

	// Logger receives what cannot be told to the client: a handler panic,
	// an outcome the backend failed to record, the error of Scope.
	// Refusals a client can cause at will (no credentials for the scope, a
	// full store) are logged at Debug at most, so that no client can flood
	// the log. Nil means slog.Default().
	Logger *slog.Logger
}

// defaultMaxStoredReply is MaxStoredReply's default, idemhttp's for bodies.
const defaultMaxStoredReply = 1 << 20

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
	if opts.MaxStoredReply <= 0 {
		opts.MaxStoredReply = defaultMaxStoredReply
	}
	var methods map[string]bool
	if opts.Methods != nil {
		methods = make(map[string]bool, len(opts.Methods))
		for _, m := range opts.Methods {
			methods[m] = true
		}
	}
	s := &server{store: store, opts: opts, keep: newMetadataPolicy(opts.StoredMetadata, opts.SkipMetadata)}
	s.setLimits()
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
	keep  metadataPolicy // the headers and trailers remembered

	quota   *limit.Quota   // new keys per scope
	waiters *limit.Waiters // calls held per key

	emptyScopeSeen atomic.Bool // the first empty scope is logged at Error, the rest at Debug
}

// Scope refusals: fixed messages, so that nothing of how the server checks
// credentials reaches a client.
var (
	errScope      = status.Error(codes.Unauthenticated, "the caller's scope could not be determined")
	errEmptyScope = status.Error(codes.Internal, "the server could not determine the caller's scope")
)

func (s *server) serve(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	keys := metadata.ValueFromIncomingContext(ctx, KeyHeader) // the key's values alone, not a copy of all metadata
	switch {
	case len(keys) == 0 && s.opts.Required:
		return nil, status.Error(codes.InvalidArgument, "this call needs an idempotency-key")
	case len(keys) == 0:
		return handler(ctx, req)
	case len(keys) > 1:
		return nil, status.Error(codes.InvalidArgument, "send one idempotency-key, not several")
	}
	key, err := keyfield.Parse(keys[0])
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "malformed idempotency-key: %v", err)
	}
	fp, err := fingerprint(info.FullMethod, req)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	scope := "" // unscoped: the empty scope, which Scope never gives
	if s.opts.Scope != nil {
		scope, err = s.opts.Scope(ctx)
		switch {
		case err != nil:
			// A client without credentials can cause this at will: Debug.
			s.opts.Logger.Debug("idemgrpc: Options.Scope failed; call refused", "method", info.FullMethod, "err", err)
			return nil, errScope
		case scope == "":
			if !s.emptyScopeSeen.Swap(true) {
				// A server bug, not the client's: said loudly once, then
				// at Debug, so that no client can flood the log with it.
				s.opts.Logger.Error("idemgrpc: Options.Scope returned an empty scope; calls are refused with Internal (does the authentication interceptor run before this one?)", "method", info.FullMethod)
			} else {
				s.opts.Logger.Debug("idemgrpc: Options.Scope returned an empty scope; call refused", "method", info.FullMethod)
			}
			return nil, errEmptyScope
		}
	}
	storeKey := scopedKey(scope, key)
	if !s.waiters.Enter(storeKey) {
		s.opts.Logger.Debug("idemgrpc: too many duplicates of one key waiting; call refused", "method", info.FullMethod)
		return nil, s.retryLater(codes.Aborted, "as many calls with this idempotency-key as the server holds are waiting already; retry with the same key", s.opts.RetryAfter)
	}
	defer s.waiters.Leave(storeKey)
	if s.opts.InTx != nil {
		return s.serveTx(ctx, req, info, handler, storeKey, fp[:], scope)
	}

	bctx := waitctx.WithTimeout(ctx, s.opts.Wait)
	defer bctx.Stop()
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
	if errors.Is(err, errOverQuota) {
		return nil, s.overQuota(scope)
	}
	if err != nil {
		// Wait ran out before the claim was tried (a loaded server): a
		// wait that ran out, not the store's failure.
		return nil, s.refusal(waitctx.RanOut(bctx, err))
	}
	defer t.Release()
	if t.Replayed() {
		reply, err := t.Result()
		return s.replay(ctx, reply, err)
	}
	// Counted only for a key this call claimed, so that replays and the
	// duplicates waiting on a key never spend the scope's quota, and a
	// scope over it still gets its known keys' replays. The key claimed
	// over the quota is let go, and calls waiting on it hear so.
	quota, withinQuota := s.quota.Reserve(scope)
	if !withinQuota {
		t.Finish(Reply{}, errOverQuota)
		return nil, s.overQuota(scope)
	}
	kept := false
	defer func() {
		if !kept { // released, or the handler ended its goroutine: it holds nothing
			quota.Cancel()
		}
	}()
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
		rec := &recordingStream{ServerTransportStream: grpc.ServerTransportStreamFromContext(work), keep: s.keep, maxReply: s.opts.MaxStoredReply}
		defer rec.end() // a panic or a Goexit ends it too
		resp, err := handler(grpc.NewContextWithServerTransportStream(work, rec), req)
		rec.end() // what its goroutines set from now on is refused
		own = resp
		return rec.reply(resp, err)
	})
	kept = err == nil
	if err != nil {
		var pe *idem.PanicError // declared here: errors.As moves it to the heap, on every call if above
		if errors.As(err, &pe) {
			s.opts.Logger.Error("idemgrpc: handler panicked; its key is released", "method", info.FullMethod, "panic", pe.Value, "stack", string(pe.Stack))
			return nil, status.Error(codes.Internal, "the call failed; it may be retried with the same key")
		}
		var unstored *handlerError
		if errors.As(err, &unstored) {
			return nil, unstored.err // the handler's own error, not remembered
		}
		return nil, err
	}
	if reply.Code == codes.OK {
		// The store keeps the response's bytes, or only its size, not the
		// message: this caller gets the handler's own, whole.
		return own, nil
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
		return s.retryLater(codes.Aborted, "a call with this idempotency-key is still being processed; retry with the same key", s.opts.RetryAfter)
	case errors.Is(err, idem.ErrOutcomeUnknown):
		return status.Error(codes.Internal, "a call with this idempotency-key was interrupted and its outcome is unknown; it needs an operator")
	case errors.Is(err, idem.ErrFull):
		s.opts.Logger.Debug("idemgrpc: store full; call refused", "err", err)
		return status.Error(codes.ResourceExhausted, "the server holds as many calls in flight as it can track; retry later with the same key")
	case errors.Is(err, idem.ErrInvalidKey):
		return status.Errorf(codes.InvalidArgument, "malformed idempotency-key: %v", err)
	}
	var pe *idem.PanicError
	if errors.As(err, &pe) || errors.Is(err, idem.ErrGoexit) {
		return status.Error(codes.Internal, "the call failed; it may be retried with the same key")
	}
	if idem.IsFinal(err) {
		// A final error recorded for the key: never the interceptor's own
		// (a handler's is kept in its Reply), but an operator's (idem
		// resolve -error, Store.Resolve). Its message is theirs; and a
		// client can ask again at will: Debug.
		s.opts.Logger.Debug("idemgrpc: the key's recorded outcome is a final error", "err", err)
		return status.Error(codes.Internal, "the call with this idempotency-key ended in a final error; it will not run again")
	}
	s.opts.Logger.Error("idemgrpc: store unavailable", "err", err)
	return status.Error(codes.Unavailable, "idempotency keys cannot be checked right now; retry with the same key")
}

// replay answers a call from a remembered reply, marked as a replay. Its
// metadata is filtered again, for records stored before a key was barred.
func (s *server) replay(ctx context.Context, reply Reply, err error) (any, error) {
	if err != nil {
		return nil, s.refusal(err)
	}
	marks := metadata.Pairs(ReplayedHeader, "true")
	if reply.Code == codes.OK && reply.Omitted > 0 {
		marks.Set(BodyOmittedHeader, "true")
	}
	_ = grpc.SetHeader(ctx, metadata.Join(s.keep.filter(reply.Header), marks))
	trailer := s.keep.filter(reply.Trailer)
	if reply.Code != codes.OK {
		// An error's mark goes with its status too: the trailers are the
		// frame that carries the status, so a client that reads the mark
		// there knows the status is this replay's (UnaryClientInterceptor
		// stops retrying at it), while headers alone may be followed by a
		// dropped connection, whose error is no answer of the server's.
		trailer = metadata.Join(trailer, metadata.Pairs(ReplayedHeader, "true"))
	}
	if len(trailer) > 0 {
		_ = grpc.SetTrailer(ctx, trailer)
	}
	return s.decode(reply)
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
