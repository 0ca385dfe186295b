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
	case (t.lease != nil && !t.leaseTaken) || t.begun: // the claim is fully made (and told): finish it
		t.finished = true
		var zero R
		s.finish(t, zero, ErrGoexit)
		return
	case t.claim != nil: // a durable claim, not yet renewed
		_ = s.letGo(context.WithoutCancel(t.ctx), *t.claim, t.op)
	}
	t.endWork()
	t.e, e.err = nil, ErrGoexit
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
			if err == ErrClosed && again { // it closed while this call waited
				return errClosedWhileHeld
			}
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
			// Another payload's claim on its way to the Backend, or an
			// operator's Forget or Resolve at work there: the key's
			// payload is the Backend's to say, once it has landed or
			// ended. Close ends the wait: an operator's call is not
			// waited for.
			if err := recheck(ctx, e, s.stopping.Done()); err != nil {
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
// an error matching both ErrInProgress and ctx's error if ctx ends first,
// or ErrInProgress and ErrClosed if stop is closed first (the store is
// closing).
func recheck[R any](ctx context.Context, e *entry[R], stop <-chan struct{}) error {
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
	case <-stop:
		select {
		case <-e.done:
		case <-e.checked:
		default:
			return errClosedWhileHeld
		}
	}
	return nil
}

// workContext returns the context an owner works under: ctx's values
// without its cancellation, bounded by Options.ExecutionTimeout.
// d, if not nil, is where to keep the detached context. A ctx with a
// deadline can end, which is known without asking for its Done channel:
// a context that makes its timer only when Done is asked for (an
// adapter's wait bound, internal/waitctx) is not made to make it here.
func (s *Store[R]) workContext(ctx context.Context, d *detached) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok || ctx.Done() != nil {
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
