package idem

import (
	"context"
	"errors"
	"fmt"

	"github.com/seed094d4201/idem/backend"
)

// Resolve settles an interrupted key as done: an operator (or code that
// reconciles) has checked that the operation took effect, and val, or err
// if it is not nil, is the outcome to replay to every later call with the
// key, as if the owner had recorded it before it died. err is remembered as
// a final error (Final is applied for you). The outcome expires after
// Options.TTL, like any other.
//
// Forget is for the other answer, "it did not happen": it clears the key
// so that the next call runs the operation. Resolve never runs anything.
//
// Only an interrupted key can be resolved. A key in flight, here or under a
// live lease elsewhere, is refused with ErrKeyHeld; a key with no
// record, or with a recorded outcome, with ErrNotInterrupted. Resolving is
// fenced by the interrupted claim's token: if the key changes hands
// meanwhile (its owner records after all, another store takes it over),
// Resolve fails with ErrNotInterrupted and changes nothing. A store without
// a Backend has no interrupted keys.
func (s *Store[R]) Resolve(ctx context.Context, key string, val R, err error) error {
	if ctx == nil {
		return errNilContext
	}
	if cerr := ctx.Err(); cerr != nil {
		return cerr
	}
	if kerr := CheckKey(key); kerr != nil {
		return kerr
	}
	switch {
	case s.closed.Load():
		return ErrClosed
	case s.opts.Backend == nil && s.table.inFlight(key):
		return fmt.Errorf("%w: key %q is in flight in this store", ErrKeyHeld, key)
	case s.opts.Backend == nil:
		return fmt.Errorf("%w: a store without a Backend keeps no interrupted keys", ErrNotInterrupted)
	}
	// Held here meanwhile, as Forget holds it: no claim of the key
	// starts here while its record is read and overwritten.
	m, herr := s.table.reconcile(key)
	if herr != nil {
		return herr
	}
	defer s.table.reconciled(m)
	rec, ok, gerr := s.b.Get(ctx, key, s.opts.Now())
	switch {
	case gerr != nil:
		return &BackendError{Op: "get", Err: gerr}
	case !ok:
		return fmt.Errorf("%w: key %q has no record", ErrNotInterrupted, key)
	case rec.State == backend.StatePending:
		return fmt.Errorf("%w: key %q is claimed and its lease holds", ErrKeyHeld, key)
	case rec.State == backend.StateCompleted:
		return fmt.Errorf("%w: key %q already has an outcome", ErrNotInterrupted, key)
	}
	done := rec
	// err's methods are the operator's code: read under guard, as the
	// work's error is (a typed nil's Error panics).
	if eerr := s.encode(&done, val, checkedError(Final(err))); eerr != nil {
		return eerr
	}
	switch cerr := s.complete(context.WithoutCancel(ctx), done, s.opts.Now()); {
	case errors.Is(cerr, backend.ErrNotOwner):
		return fmt.Errorf("%w: key %q changed hands while it was resolved", ErrNotInterrupted, key)
	case cerr != nil:
		return &BackendError{Op: "resolve", Err: cerr}
	}
	return nil
}
