package idem

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// begin fills t for key: a replay, or the key claimed by t (t.e set). It is
// Begin, beginLocal (local) and RunOnce. wantDone asks for a done channel on
// a claimed entry, for an owner that may stop waiting before its
// execution ends. t must not escape, so that a replay allocates nothing.
//
// The user's code that runs once the key is claimed (the Observer, the
// Codec decoding a replay) may end the goroutine with runtime.Goexit; the
// deferred guard then releases the key, so that it is not left in flight.
func (s *Store[R]) begin(ctx context.Context, key string, payload any, wantDone, local bool, t *Ticket[R]) error {
	exited := true
	defer func() {
		if exited {
			s.claimExited(t)
		}
	}()
	err := s.observedBegin(ctx, key, payload, wantDone, local, t)
	exited = false
	return err
}

// claimExited releases the key t claimed, if it holds one, after the
// user's code ended begin's goroutine.
func (s *Store[R]) claimExited(t *Ticket[R]) {
	e := t.e
	switch {
	case e == nil || t.finished:
		return
	case t.stopLease != nil || t.begun: // the claim is fully made (and told): finish it
		t.finished = true
		var zero R
		s.finish(t, zero, errGoexit)
		return
	case t.claim != nil: // a durable claim, not yet renewed
		_ = s.letGo(context.WithoutCancel(t.ctx), *t.claim, t.op)
	}
	if t.cancel != nil {
		t.cancel()
	}
	t.e, e.err = nil, errGoexit
	s.table.release(e)
}

// observedBegin is begin without the guard.
func (s *Store[R]) observedBegin(ctx context.Context, key string, payload any, wantDone, local bool, t *Ticket[R]) error {
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
	t.begun = true // before: a Goexit in Executing still ends what began
	s.executing(ctx, +1)
	return nil
}

// claimKey is begin without the Observer.
func (s *Store[R]) claimKey(ctx context.Context, key string, payload any, wantDone, local bool, t *Ticket[R]) error {
	if ctx == nil {
		return errNilContext
	}
	if s.misuse != nil {
		return s.misuse
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := CheckKey(key); err != nil {
		return err
	}
	fp, err := s.opts.Fingerprint(payload)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidPayload, err)
	}
	t.s, t.ctx = s, ctx
	for again := false; ; again = true {
		if again { // the first claim's ctx was checked above
			if err := ctx.Err(); err != nil {
				return fmt.Errorf("%w: %w", ErrInProgress, err)
			}
		}
		e, kind, err := s.claim(key, fp, wantDone)
		if err == ErrFull && s.opts.Backend != nil {
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
		case claimRecheck:
			// Another payload's claim on its way to the Backend: the
			// key's payload is the Backend's to say, once it has landed
			// or the claim has ended.
			if err := recheck(ctx, e); err != nil {
				return err
			}
			continue
		}
		t.e = e
		orig := t.ctx
		if wantDone && !local {
			// RunOnce's caller that may leave: its ticket goes to the heap
			// with its operation, in one allocation.
			t.run = new(detachedRun[R])
			t.ctx, t.op = withOperationIn(&t.run.op, t.ctx, key, s.opts.Codec)
		} else {
			t.ctx, t.op = s.withOperation(t.ctx, key)
		}
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

// withOperationIn is withOperation with the operation made in op, part of
// an allocation of the caller's: it must set what withOperation sets.
func withOperationIn(op *operation, ctx context.Context, key string, codec Codec) (context.Context, *operation) {
	op.key, op.codec = key, codec
	op.ctx = opContext{Context: ctx, op: op}
	return &op.ctx, op
}

// errExited is why an outcome was not recorded when the Observer or the
// Codec ended the goroutine that was recording it.
var errExited = errors.New("idem: the Observer or the Codec called runtime.Goexit while the outcome was being recorded")

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

// recheck waits until e's claim lands or its outcome is set, or returns
// an error matching both ErrInProgress and ctx's error if ctx ends first.
func recheck[R any](ctx context.Context, e *entry[R]) error {
	if testHookWait != nil {
		testHookWait()
	}
	select {
	case <-e.done:
	case <-e.checked:
	case <-ctx.Done():
		select {
		case <-e.done:
		case <-e.checked:
		default:
			return fmt.Errorf("%w: %w", ErrInProgress, ctx.Err())
		}
	}
	return nil
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
	if t.cancel != nil {
		t.cancel()
	}
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
		s.table.complete(e, time.Now().Add(s.opts.TTL))
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
	stopLease := t.takeLease()
	switch {
	case stopLease == nil:
		s.settleEntry(t, val, err, final, false)
	case !final:
		stopLease()
		_ = s.letGo(context.WithoutCancel(t.ctx), *t.claim, t.op)
		s.settleEntry(t, val, err, false, false)
	default:
		s.holdLease(stopLease)
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
