package idem

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// begin fills t for key: a replay, or the key claimed by t (t.e set). It is
// Begin, BeginLocal (local) and RunOnce. wantDone asks for a done channel on
// a claimed entry, for an owner that may stop waiting before its
// execution ends. t must not escape, so that a replay allocates nothing.
func (s *Store[R]) begin(ctx context.Context, key string, payload any, wantDone, local bool, t *Ticket[R]) error {
	o := s.opts.Observer
	if o == nil || ctx == nil {
		return s.claimKey(ctx, key, payload, wantDone, local, t)
	}
	start := time.Now()
	err := s.claimKey(ctx, key, payload, wantDone, local, t)
	if err != nil || t.e == nil {
		s.observe(ctx, key, t, err, start)
		return err
	}
	t.start = start
	s.executing(ctx, +1)
	return nil
}

// claimKey is begin without the Observer.
func (s *Store[R]) claimKey(ctx context.Context, key string, payload any, wantDone, local bool, t *Ticket[R]) error {
	if ctx == nil {
		return errNilContext
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := CheckKey(key); err != nil {
		return err
	}
	fp, err := s.opts.Fingerprint(payload)
	if err != nil {
		return err
	}
	t.s, t.ctx = s, ctx
	for {
		if err := ctx.Err(); err != nil { // only after a yield: checked above
			return fmt.Errorf("%w: %w", ErrInProgress, err)
		}
		e, kind, err := s.claim(key, fp, wantDone)
		if err == ErrFull && s.opts.Backend != nil && !local {
			t.val, t.err, err = s.replayWhenFull(ctx, key, fp)
			return err
		}
		if err != nil {
			return err
		}
		switch kind {
		case claimReplay:
			t.val, t.err = e.val, e.err
			return nil
		case claimWait:
			t.waited = true
			if err := wait(ctx, e); err != nil {
				return err
			}
			switch {
			case e.shared:
				t.val, t.err = e.val, e.err
				return nil
			case e.err == errYield:
				continue // its owner left before it learnt anything: claim afresh
			}
			return e.err
		}
		t.e = e
		orig := t.ctx
		t.ctx, t.op = s.withOperation(t.ctx, key)
		if s.opts.Backend == nil || local {
			t.startSpan()
			return nil
		}
		err = s.beginDurable(ctx, t)
		if t.e == nil { // a replay, or no claim: no operation either
			t.ctx, t.op = orig, nil
		}
		return err
	}
}

// errYield is what an owner that gave up before it learnt the key's fate
// (its ctx ended while another process held the key) leaves its entry's
// waiters: they claim again, each under its own ctx.
var errYield = errors.New("idem: the claim was given up; claim again")

// wait waits until e's outcome is set, or returns an error matching both
// ErrInProgress and ctx's error if ctx ends first.
func wait[R any](ctx context.Context, e *entry[R]) error {
	if testHookWait != nil {
		testHookWait()
	}
	select {
	case <-e.done:
		return nil
	case <-ctx.Done():
		select {
		case <-e.done: // finished at the same moment: prefer the outcome
			return nil
		default:
			return fmt.Errorf("%w: %w", ErrInProgress, ctx.Err())
		}
	}
}

// workContext returns the context an owner works under: ctx's values
// without its cancellation, bounded by Options.ExecutionTimeout.
// d, if not nil, is where to keep the detached context.
func (s *Store[R]) workContext(ctx context.Context, d *detached) (context.Context, context.CancelFunc) {
	if ctx.Done() != nil {
		if d == nil {
			ctx = context.WithoutCancel(ctx)
		} else {
			d.parent = ctx
			ctx = d
		}
	}
	if d := s.opts.ExecutionTimeout; d > 0 {
		return context.WithTimeout(ctx, d)
	}
	return ctx, nil
}

// finish settles the owned ticket t with the work's outcome and returns
// what its caller answers: a final outcome is completed (in memory, or in
// the Backend and then dropped from memory), anything else releases the
// key. The waiters in this process get the outcome either way.
func (s *Store[R]) finish(t *Ticket[R], val R, err error) (R, error) {
	e := t.e
	final := isFinalOutcome(err)
	pin := false
	if t.claim != nil {
		var endRecord func(error)
		t.ctx, endRecord = s.span(t.ctx, "idem.record", e.key)
		val, err, pin = s.finishDurable(t, val, err, final)
		endRecord(err)
	}
	if t.cancel != nil {
		t.cancel()
	}
	e.val, e.err = val, err
	e.shared = final
	switch {
	case pin:
		s.table.pin(e)
	case final && s.opts.Backend == nil:
		s.table.complete(e, s.opts.Now().Add(s.opts.TTL))
	default: // the backend remembers a final outcome; memory keeps in-flight keys only
		s.table.release(e)
	}
	// The Observer last, once the key is settled for everyone.
	if t.endSpan != nil {
		t.endSpan(err)
	}
	if s.opts.Observer != nil {
		s.callObserver(t.ctx, e.key, t.ownerOutcome(final, err), time.Since(t.start))
		s.executing(t.ctx, -1)
	}
	return val, err
}

// ownerOutcome is how the call that owned the key ended: a replay that a
// transactional mode found (FinishReplayed), a final outcome, or else, as
// the error says, a refusal found in a transaction or a failure before
// commit.
func (t *Ticket[R]) ownerOutcome(final bool, err error) Outcome {
	switch {
	case t.replayed:
		return OutcomeReplayed
	case final:
		return OutcomeExecuted
	case errors.Is(err, ErrPayloadMismatch):
		return OutcomeMismatch
	case errors.Is(err, ErrOutcomeUnknown):
		return OutcomeUnknown
	case errors.Is(err, ErrInProgress):
		return OutcomeInProgress
	case isBackendError(err):
		return OutcomeBackendError
	}
	return OutcomeReleased
}

// isFinalOutcome reports whether the work's error ends the operation for
// good: nil or marked Final, and not a panic (whatever its value).
func isFinalOutcome(err error) bool {
	if err == nil {
		return true
	}
	var pe *PanicError
	return IsFinal(err) && !errors.As(err, &pe)
}
