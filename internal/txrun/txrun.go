// Package txrun holds what the transactional modes (postgres, sqlite and
// bolt RunOnceTx) share: running a ticket's work so that its caller waits
// under its own ctx, as RunOnce's callers do.
package txrun

import (
	"context"
	"fmt"

	"github.com/seed094d4201/idem"
)

// Do runs work with t.Do and returns its outcome, or, if ctx ends first,
// an error that matches both idem.ErrInProgress and ctx.Err() while the
// work goes on and settles the key for the duplicates that wait on it. t
// must be a ticket that owns its key (not replayed), and Do takes it over:
// it releases t if work never finishes it, so the caller must not.
func Do[R any](ctx context.Context, t *idem.Ticket[R], work func(context.Context) (R, error)) (R, error) {
	if ctx.Done() == nil { // a ctx that cannot end: no goroutine needed
		defer t.Release()
		return t.Do(work)
	}
	type outcome struct {
		val R
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		// Deferred, so that the caller hears even of a work that ended its
		// goroutine (runtime.Goexit): Finish on a finished ticket returns
		// the outcome it was settled with.
		defer func() {
			t.Release()
			var zero R
			val, err := t.Finish(zero, nil)
			done <- outcome{val, err}
		}()
		t.Do(work)
	}()
	select {
	case o := <-done:
		return o.val, o.err
	case <-ctx.Done():
		var zero R
		return zero, fmt.Errorf("%w: %w", idem.ErrInProgress, ctx.Err())
	}
}

// Unrecorded is the error of a transactional call whose outcome could not
// be committed, so that nothing was: neither the key nor fn's writes. It
// wraps cause and names what fn returned, but is never final, whatever fn
// returned: the key is free, and the next call runs fn again.
func Unrecorded(fnErr, cause error) error {
	if fnErr == nil {
		return cause
	}
	return fmt.Errorf("%w (fn's final error %q was not recorded: nothing was committed)", cause, fnErr.Error())
}
