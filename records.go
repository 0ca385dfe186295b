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

// errListingStopped ends a listing whose consumer stopped iterating.
var errListingStopped = errors.New("idem: listing stopped")

// Records returns the records the Backend holds in the given states (in
// every state if none is given), interrupted ones first, each as the
// backend's clock sees it: a pending record whose lease lapsed is
// interrupted. It is for reconciliation code: find the keys a dead owner
// left interrupted, check each operation's real outcome, then Resolve or
// Forget them. Iteration stops at the first error, which is yielded with
// a zero Record.
//
// It streams: records come as the backend reads them, in pages (see
// backend.Lister), with memory flat however many there are, and the loop
// body may call the store (Resolve, Forget) on each. Interrupted records
// first costs a second pass over the backend when both they and others
// are asked for. A listing is not a snapshot: a record that changes state
// between the passes may come twice or not at all.
func (s *Store[R]) Records(ctx context.Context, states ...backend.RecordState) iter.Seq2[backend.Record, error] {
	return func(yield func(backend.Record, error) bool) {
		lister, ok := s.b, s.b.ls != nil
		switch {
		case ctx == nil:
			yield(backend.Record{}, errNilContext)
			return
		case !ok:
			yield(backend.Record{}, ErrNotListable)
			return
		}
		want := func(st backend.RecordState) bool { return len(states) == 0 || slices.Contains(states, st) }
		passes := []func(backend.RecordState) bool{
			func(st backend.RecordState) bool { return st == backend.StateInterrupted && want(st) },
			func(st backend.RecordState) bool { return st != backend.StateInterrupted && want(st) },
		}
		if !want(backend.StateInterrupted) {
			passes = passes[1:]
		} else if len(states) > 0 && !slices.ContainsFunc(states, func(st backend.RecordState) bool { return st != backend.StateInterrupted }) {
			passes = passes[:1]
		}
		// The loop body is called no more once it stopped (returned false,
		// panicked), whatever the Backend's Each does with the error that
		// says so: one that goes on, or hands back another error, must not
		// make the loop go on (a runtime error), nor swallow its panic.
		stopped, panicked := false, false
		var bodyPanic any
		body := func(rec backend.Record) bool {
			returned := false
			defer guard(&returned, func(v any) {
				stopped, panicked, bodyPanic = true, true, v
				panic(v) // the loop body's own: it goes on up
			}, func() { stopped = true })
			more := yield(rec, nil)
			returned = true
			stopped = !more
			return more
		}
		for _, keep := range passes {
			err := lister.Each(ctx, func(rec backend.Record) error {
				if stopped {
					return errListingStopped
				}
				seen, ok, err := s.seen(ctx, lister, rec)
				switch {
				case err != nil:
					return err
				case !ok || !keep(seen.State):
					return nil
				case !body(seen):
					return errListingStopped
				}
				return nil
			})
			switch {
			case panicked: // the Backend recovered the loop body's panic
				panic(bodyPanic)
			case stopped || errors.Is(err, errListingStopped):
				return
			case err != nil:
				yield(backend.Record{}, &BackendError{Op: "list", Err: err})
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
