package idemgrpc

import (
	"context"
	"errors"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/internal/limit"
	"github.com/seed094d4201/idem/internal/txrun"
	"github.com/seed094d4201/idem/internal/waitctx"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// serveTx is serve's run in the transactional mode (Options.InTx): the key
// is claimed in a transaction of the store's database, the handler runs in
// it with its headers and trailers held, and its answer goes out only once
// the handler's rows, the key and the reply have committed together.
func (s *server) serveTx(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler, storeKey string, fp []byte, scope string) (any, error) {
	wait := txrun.NewWaitBound(ctx, s.opts.Wait)
	defer wait.Stop()
	var (
		quota limit.Reservation
		rec   *recordingStream
		own   any // the handler's response, this call's to return
	)
	run := func(work context.Context) (Reply, error) {
		if !wait.Start() {
			return Reply{}, txrun.ErrGaveUp
		}
		// Counted only for a key this call claimed, as in serve.
		var ok bool
		if quota, ok = s.quota.Reserve(scope); !ok {
			return Reply{}, errOverQuota
		}
		if deadline, ok := ctx.Deadline(); ok {
			// As in serve: the caller's deadline, not its cancellation,
			// bounds the handler.
			var cancel context.CancelFunc
			work, cancel = context.WithDeadline(work, deadline)
			defer cancel()
		}
		rec = &recordingStream{ServerTransportStream: grpc.ServerTransportStreamFromContext(work), keep: s.keep, maxReply: s.opts.MaxStoredReply, held: true}
		defer rec.end() // a panic or a Goexit ends it too
		resp, err := handler(grpc.NewContextWithServerTransportStream(work, rec), req)
		rec.end() // what its goroutines set from now on is refused
		own = resp
		return rec.reply(resp, err)
	}
	reply, err := s.opts.InTx(wait.Ctx(), s.store, storeKey, fp, run)
	for err != nil && !wait.Started() && ctx.Err() == nil && ranOutOfTime(err) {
		// As in serve: the run this call waited on ran out of its own
		// caller's time, and rolled back; this caller has time left.
		reply, err = s.opts.InTx(wait.Ctx(), s.store, storeKey, fp, run)
	}
	if !wait.Started() { // a replay, or why there is none: no handler ran here
		switch cerr := ctx.Err(); {
		case err == nil:
			return s.replay(ctx, reply, nil)
		case errors.Is(err, errOverQuota):
			return nil, s.overQuota(scope)
		case cerr != nil:
			// The caller's own deadline (or cancellation) ended the wait:
			// answer as gRPC does, as serve does.
			return nil, status.FromContextError(cerr).Err()
		}
		return nil, s.refusal(waitctx.RanOut(wait.Ctx(), err))
	}
	var pe *idem.PanicError
	var unstored *handlerError
	switch {
	case err == nil: // committed: the handler's own answer, not a replay
		rec.release()
		if reply.Code == codes.OK {
			return own, nil // whole, even if too large to keep
		}
		return s.decode(reply)
	case errors.Is(err, errOverQuota):
		return nil, s.overQuota(scope)
	case errors.As(err, &pe):
		quota.Cancel()
		s.opts.Logger.Error("idemgrpc: handler panicked; its writes were rolled back and its key released", "method", info.FullMethod, "panic", pe.Value, "stack", string(pe.Stack))
		return nil, status.Error(codes.Internal, "the call failed; it may be retried with the same key")
	case errors.Is(err, idem.ErrGoexit): // as a panic: the handler's goroutine ended
		quota.Cancel()
		s.opts.Logger.Error("idemgrpc: handler called runtime.Goexit; its writes were rolled back and its key released", "method", info.FullMethod)
		return nil, status.Error(codes.Internal, "the call failed; it may be retried with the same key")
	case errors.As(err, &unstored):
		// Rolled back, and delivered as the handler returned it, with the
		// metadata it set, as serve delivers it.
		quota.Cancel()
		rec.release()
		return nil, unstored.err
	}
	// The transaction did not commit (the commit failed, the handler ended
	// the transaction itself, the store's ExecutionTimeout): nothing of the
	// handler's is kept, so nothing of its answer may be sent.
	quota.Cancel()
	s.opts.Logger.Error("idemgrpc: the handler's transaction did not commit; nothing of it was kept", "method", info.FullMethod, "err", err)
	return nil, s.retryLater(codes.Unavailable, "the call's changes could not be committed, so nothing was saved; retry with the same key", s.opts.RetryAfter)
}
