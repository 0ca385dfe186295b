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
		defer t.Release()
		val, err := t.Do(work)
		done <- outcome{val, err}
	}()
	select {
	case o := <-done:
		return o.val, o.err
	case <-ctx.Done():
		var zero R
		return zero, fmt.Errorf("%w: %w", idem.ErrInProgress, ctx.Err())
	}
}
