package idem

import (
	"context"
	"errors"
	"time"
)

// An Outcome is how a call with a key ended, as an Observer is told.
type Outcome uint8

const (
	OutcomeExecuted     Outcome = iota + 1 // the call ran the work, and its outcome is final
	OutcomeReleased                        // the call ran the work, which failed before commit: the key is free again
	OutcomeReplayed                        // answered from a remembered outcome
	OutcomeCoalesced                       // waited for an execution in flight and got its outcome
	OutcomeMismatch                        // ErrPayloadMismatch
	OutcomeInProgress                      // ErrInProgress: the caller stopped waiting
	OutcomeUnknown                         // ErrOutcomeUnknown: the key is interrupted
	OutcomeBackendError                    // a *BackendError
	OutcomeRefused                         // ErrInvalidKey, ErrFull, ErrClosed or another refusal
)

var outcomeNames = [...]string{"", "executed", "released", "replayed", "coalesced", "mismatch", "in_progress", "outcome_unknown", "backend_error", "refused"}

func (o Outcome) String() string {
	if int(o) < len(outcomeNames) && o != 0 {
		return outcomeNames[o]
	}
	return "invalid"
}

// An Observer is told what a Store does, for metrics, traces and logs;
// package idemotel turns it into OpenTelemetry. Every field may be nil.
// The functions run on the caller's goroutine, on the request path: they
// must be fast, safe for concurrent use, and must not call the Store. A
// Store without one (Options.Observer nil) pays nothing for them.
type Observer struct {
	// Call is told how each call with a key (RunOnce, Begin, RunOnceTx)
	// ended, and how long it took: for a call that ran the work, until
	// its outcome was settled; for the others, waits included. ctx is the
	// caller's, or for a call that ran the work the "idem.execute" span's,
	// which ends just after.
	Call func(ctx context.Context, key string, outcome Outcome, took time.Duration)

	// Executing is told when work under a claim starts (+1) and ends (-1):
	// the keys in flight in this process.
	Executing func(ctx context.Context, delta int)

	// Span starts a span around a phase of a call: "idem.claim" (a claim
	// in the Backend, waits for another process included), "idem.execute"
	// (the work, whose context is the span's) and "idem.record" (writing
	// the outcome to the Backend). It returns the context the phase runs
	// under and a func to end the span with what failed in that phase:
	// the work's error for "idem.execute"; nil for a claim that found a
	// replay or a different payload, and for a record that wrote the
	// outcome, a final error or a release alike.
	Span func(ctx context.Context, phase, key string) (context.Context, func(error))

	// Sweep is told how many expired outcomes a sweep removed, and its
	// error.
	Sweep func(ctx context.Context, removed int, err error)

	// NotRecorded is told of a final outcome that the Backend could not
	// record (err is a *NotRecordedError saying why, and whether the claim
	// was lost to another owner), before any caller is answered: the
	// callers still waiting get the outcome all the same (the operation
	// took effect), and one whose ctx ended first got ErrInProgress and
	// gets the outcome on a retry. ctx carries the first caller's values,
	// not its cancellation. The store logs it at Error too.
	NotRecorded func(ctx context.Context, key string, err error)
}

// notRecorded logs and reports a final outcome the Backend could not
// record.
func (s *Store[R]) notRecorded(ctx context.Context, key string, err *NotRecordedError) {
	s.opts.Logger.Error("idem: outcome not recorded", "key", key, "err", err)
	if o := s.opts.Observer; o != nil && o.NotRecorded != nil {
		returned := false
		defer guard(&returned, func(v any) { s.observerPanicked("NotRecorded", v) }, nil)
		o.NotRecorded(context.WithoutCancel(ctx), key, err)
		returned = true
	}
}

// observe tells the Observer, if any, how a call that did not run the work
// ended.
func (s *Store[R]) observe(ctx context.Context, key string, t *Ticket[R], err error, start time.Time) {
	o := s.opts.Observer
	if o == nil || o.Call == nil || (err == nil && t.e != nil) {
		return
	}
	s.callObserver(ctx, key, outcomeOf(t, err), time.Since(start))
}

// The Observer's functions are the user's code, run on the request path
// and on RunOnce's own goroutine: a panic in one is logged and dropped, so
// that it can neither strand a key nor crash the process.

func (s *Store[R]) callObserver(ctx context.Context, key string, outcome Outcome, took time.Duration) {
	if o := s.opts.Observer; o != nil && o.Call != nil {
		returned := false
		defer guard(&returned, func(v any) { s.observerPanicked("Call", v) }, nil)
		o.Call(ctx, key, outcome, took)
		returned = true
	}
}

func (s *Store[R]) executing(ctx context.Context, delta int) {
	if o := s.opts.Observer; o != nil && o.Executing != nil {
		returned := false
		defer guard(&returned, func(v any) { s.observerPanicked("Executing", v) }, nil)
		o.Executing(ctx, delta)
		returned = true
	}
}

// observerPanicked logs a panic in the Observer's fn, which is ignored.
func (s *Store[R]) observerPanicked(fn string, v any) {
	s.opts.Logger.Error("idem: the Observer's "+fn+" panicked; ignored", "panic", v)
}

// outcomeOf classifies a call that did not become the key's owner.
func outcomeOf[R any](t *Ticket[R], err error) Outcome {
	switch {
	case err == nil && t.waited:
		return OutcomeCoalesced
	case err == nil:
		return OutcomeReplayed
	case errors.Is(err, ErrPayloadMismatch):
		return OutcomeMismatch
	case errors.Is(err, ErrOutcomeUnknown):
		return OutcomeUnknown
	case errors.Is(err, ErrInProgress):
		return OutcomeInProgress
	case t.waited:
		return OutcomeCoalesced // the shared execution's failure
	case isBackendError(err):
		return OutcomeBackendError
	}
	return OutcomeRefused
}

// isBackendError is apart so that its errors.As target is allocated only
// for an error, never for a replay.
func isBackendError(err error) bool {
	var be *BackendError
	return errors.As(err, &be)
}

// span starts a span for phase if the Observer wants them; end is never
// nil, and neither it nor the start lets a panic through.
func (s *Store[R]) span(ctx context.Context, phase, key string) (sctx context.Context, end func(error)) {
	o := s.opts.Observer
	if o == nil || o.Span == nil {
		return ctx, noEnd
	}
	returned := false
	defer guard(&returned, func(v any) {
		s.observerPanicked("Span", v)
		sctx, end = ctx, noEnd // the phase runs under ctx, as without a span
	}, nil)
	sctx, sEnd := o.Span(ctx, phase, key)
	returned = true
	if sctx == nil || sEnd == nil {
		return ctx, noEnd
	}
	return sctx, func(err error) {
		returned := false
		defer guard(&returned, func(v any) { s.observerPanicked("Span's end", v) }, nil)
		sEnd(err)
		returned = true
	}
}

func noEnd(error) {}

// startSpan starts the Observer's "idem.execute" span for an owner, whose
// work then runs under the span's context.
func (t *Ticket[R]) startSpan() {
	if o := t.s.opts.Observer; o != nil && o.Span != nil {
		t.ctx, t.endSpan = t.s.span(t.ctx, "idem.execute", t.e.key)
	}
}
