package idem

import (
	"context"
	"errors"
	"time"
)

// finish settles the owned ticket t with the work's outcome and returns
// what its caller answers: a final outcome is completed (in memory, or in
// the Backend and then dropped from memory), anything else releases the
// key. The waiters in this process get the outcome either way.
//
// The user's code that runs here (the Observer, the Codec) may end the
// goroutine with runtime.Goexit, as t.FailNow does. The key is then
// settled all the same, by the deferred guard, so that it is not left in
// flight with Close waiting for it.
func (s *Store[R]) finish(t *Ticket[R], val R, err error) (R, error) {
	if t.claim == nil && s.opts.Observer == nil && s.sysClock {
		// No user code runs from here on (no Backend write, no Observer,
		// no Codec, the system clock): nothing can end the goroutine
		// before the key is settled, so there is nothing to guard.
		if t.op != nil {
			t.op.end()
		}
		s.settleEntry(t, val, err, isFinalOutcome(err), false)
		return val, err
	}
	e := t.e
	if s.opts.Observer != nil {
		// The Observer hears the end last, after the waiters woke and the
		// table let Close go on: Close and Shutdown wait for it here.
		s.telling.Add(1)
		s.background.Add(1)
		defer func() { s.telling.Add(-1); s.background.Done() }()
	}
	if t.op != nil {
		t.op.end()
	}
	final := isFinalOutcome(err)
	settled, recorded := false, false
	pin, endRecord := false, noEnd
	ectx := t.ctx
	defer func() {
		if settled {
			return
		}
		if endRecord != nil { // the Codec or Backend ended the goroutine before the span's end
			defer endRecord(errRecordExited)
		}
		t.ctx = ectx
		switch {
		case recorded: // the Observer's NotRecorded or a span's end ended the goroutine
			s.settleEntry(t, val, err, final, pin)
		default:
			s.finishExited(t, val, err, final)
		}
		s.finished(t, err, final)
	}()
	var unrecorded *NotRecordedError
	var releaseErr error // the release's own failure, for the record span
	if t.claim != nil {
		t.ctx, endRecord = s.span(t.ctx, "idem.record", e.key)
		unrecorded, pin, releaseErr = s.finishDurable(t, val, err, final)
		if releaseErr != nil {
			err = errors.Join(err, releaseErr)
		}
	}
	recorded = true // as far as it will be: the entry's fate is known
	end := endRecord
	if unrecorded != nil {
		// Before the waiters wake: whoever hears the outcome may
		// rely on the Observer having heard it was not recorded.
		s.notRecorded(t.ctx, e.key, unrecorded)
	}
	endRecord = nil // ended here, whatever the end does
	if unrecorded != nil {
		end(unrecorded)
	} else {
		end(releaseErr) // nil when the write landed, whatever the outcome it wrote
	}
	t.ctx = ectx // the Observer's Call runs under the execute span, which is still open
	s.settleEntry(t, val, err, final, pin)
	settled = true
	s.finished(t, err, final)
	return val, err
}

// errRecordExited ends the record span of a write the user's code (a
// Codec, a Backend) cut short by ending the goroutine.
var errRecordExited = errors.New("idem: the outcome's write ended its goroutine")

// finished tells the Observer, last, once the key is settled for
// everyone, how t's execution ended; also when the user's code ended
// finish's goroutine, so that no span and no gauge is left open.
// Deferred in reverse, so that a Goexit in one hook skips none after it.
func (s *Store[R]) finished(t *Ticket[R], err error, final bool) {
	if s.opts.Observer == nil {
		return
	}
	defer s.executing(t.ctx, -1)
	if t.endSpan != nil {
		defer t.endSpan(err)
	}
	// Under the execute span's context, before it ends: an Observer may
	// mark the span with the outcome.
	s.callObserver(t.ctx, t.e.key, t.ownerOutcome(final, err), time.Since(t.start))
}

// settleEntry ends t's work context and settles its entry in memory with
// the outcome: pinned (a final outcome the Backend has yet to take),
// completed (memory only) or released (the Backend remembers a final
// outcome; memory keeps in-flight keys only).
func (s *Store[R]) settleEntry(t *Ticket[R], val R, err error, final, pin bool) {
	if t.settled { // a way out of finish after the user's clock ended its goroutine in keep
		return
	}
	t.settled = true
	e := t.e
	t.endWork()
	e.val, e.err = val, err
	e.shared = final
	switch {
	case pin:
		s.table.pin(e)
	case final && s.opts.Backend == nil:
		s.keep(e)
	default:
		s.table.release(e)
	}
}

// keep completes e, whose outcome is final, until its TTL from now.
func (s *Store[R]) keep(e *entry[R]) {
	if s.sysClock {
		s.table.complete(e, s.now().Add(s.opts.TTL))
		return
	}
	s.keepByUserClock(e)
}

// keepByUserClock is keep on Options.Now, the user's code: one that ends
// the goroutine (runtime.Goexit) would end it before the key is settled,
// so the system clock answers instead, as it does for one that panics
// (guardedClock), and e is completed all the same, from the deferred
// call, as the goroutine ends. Apart from keep so that the system
// clock's path carries no deferred call: its frame stays small enough
// that a detached run's new goroutine does not grow its stack.
func (s *Store[R]) keepByUserClock(e *entry[R]) {
	returned := false
	defer exiting(&returned, func() { s.table.complete(e, time.Now().Add(s.opts.TTL)) })
	expires := s.opts.Now().Add(s.opts.TTL)
	returned = true
	s.table.complete(e, expires)
}

// finishExited settles t after finish's goroutine ended before the key
// was settled. With t's lease not yet taken by finishDurable, that was the
// user's code (the Observer's "idem.record" span, the Codec): a final
// outcome is kept in memory as one the Backend could not record, its claim
// held for as long as the store lives (a renewal that finds it recorded
// after all ends that); anything else lets the claim go, as a failure
// before commit does. Otherwise (no Backend, the Backend's Release, or its
// Complete, whose outcome finishDurable goes on recording in the
// background) the entry is settled as the work ended.
func (s *Store[R]) finishExited(t *Ticket[R], val R, err error, final bool) {
	l := t.takeLease()
	switch {
	case l == nil:
		s.settleEntry(t, val, err, final, false)
	case !final:
		l.stop()
		_ = s.letGo(context.WithoutCancel(t.ctx), *t.claim, t.op)
		s.settleEntry(t, val, err, false, false)
	default:
		s.holdLease(l)
		// Told before the waiters wake; settled even if the hook ends
		// this goroutine too.
		defer s.settleEntry(t, val, err, true, true)
		s.notRecorded(t.ctx, t.e.key, &NotRecordedError{Err: errExited})
	}
}

// ownerOutcome is how the call that owned the key ended: a replay that a
// transactional mode found (finishReplayed), a final outcome, or else, as
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
