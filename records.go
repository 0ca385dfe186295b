package idem

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"slices"

	"github.com/seed094d4201/idem/backend"
)

// ErrNotListable is returned by Records when the store has no Backend, or
// its Backend does not implement backend.Lister.
var ErrNotListable = errors.New("idem: the store's Backend cannot list its records")

// Records returns the records the Backend holds in the given states (in
// every state if none is given), interrupted ones first, each as the
// backend's clock sees it: a pending record whose lease lapsed is
// interrupted. It is for reconciliation code: find the keys a dead owner
// left interrupted, check each operation's real outcome, then Resolve or
// Forget them. Iteration stops at the first error, which is yielded with
// a zero Record.
//
// It reads the whole backend's records into memory, then asks the backend
// about each pending one: an operator's tool, not a request path.
func (s *Store[R]) Records(ctx context.Context, states ...backend.RecordState) iter.Seq2[backend.Record, error] {
	return func(yield func(backend.Record, error) bool) {
		lister, ok := s.opts.Backend.(backend.Lister)
		switch {
		case ctx == nil:
			yield(backend.Record{}, errNilContext)
			return
		case !ok:
			yield(backend.Record{}, ErrNotListable)
			return
		}
		want := func(st backend.RecordState) bool { return len(states) == 0 || slices.Contains(states, st) }
		// Each runs inside the backend's read (bbolt's read transaction,
		// a result set): no call goes back to the backend from inside it.
		var all []backend.Record
		if err := lister.Each(ctx, func(rec backend.Record) error {
			all = append(all, rec)
			return nil
		}); err != nil {
			yield(backend.Record{}, &BackendError{Op: "list", Err: err})
			return
		}
		var later []backend.Record // the others, after the interrupted ones
		for _, rec := range all {
			seen, ok, err := s.seen(ctx, lister, rec)
			switch {
			case err != nil:
				yield(backend.Record{}, &BackendError{Op: "list", Err: err})
				return
			case !ok || !want(seen.State):
			case seen.State != backend.StateInterrupted:
				later = append(later, seen)
			case !yield(seen, nil):
				return
			}
		}
		for _, rec := range later {
			if !yield(rec, nil) {
				return
			}
		}
	}
}

// seen returns rec as the backend reports it now: a pending record is
// read again with Get, whose clock judges its lease; an expired record is
// gone.
func (s *Store[R]) seen(ctx context.Context, b backend.Backend, rec backend.Record) (backend.Record, bool, error) {
	now := s.opts.Now()
	if rec.State != backend.StatePending {
		if rec.State == backend.StateCompleted && rec.Expired(now) {
			return backend.Record{}, false, nil
		}
		return rec, true, nil
	}
	got, ok, err := b.Get(ctx, rec.Key, now)
	if err != nil {
		return backend.Record{}, false, fmt.Errorf("reading %q: %w", rec.Key, err)
	}
	return got, ok, nil
}
