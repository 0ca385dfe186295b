package idem

import (
	"context"
	"errors"
	"sync"
	"time"
)

// ErrLeaseLost is the cause of fn's context when the store finds that fn's
// durable claim was lost: its lease lapsed and another owner took the key.
// The outcome of such an fn is refused (ErrNotOwner).
var ErrLeaseLost = errors.New("idem: lease lost: another owner holds the key")

// renew keeps claim's lease alive while fn runs: every third of the lease it
// extends it. If the claim turns out to be lost, or the lease runs out
// because renewals keep failing (a partition), it cancels the returned
// context with ErrLeaseLost: past that point another store may take the key
// for interrupted. stop ends the renewals. A fast fn costs one timer and no
// goroutine.
func (s *Store[R]) renew(ctx context.Context, claim Record) (_ context.Context, stop func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	every := s.opts.Lease / 3
	var (
		mu      sync.Mutex
		stopped bool               // guarded by mu
		timer   *time.Timer        // guarded by mu: set, and Reset while not stopped
		until   = claim.LeaseUntil // guarded by mu: the lease as last granted
	)
	mu.Lock()
	defer mu.Unlock()
	timer = time.AfterFunc(every, func() {
		// A renewal that lands after the outcome was recorded is refused by
		// the backend (the record is no longer pending), which is harmless.
		now := s.opts.Now()
		next := now.Add(s.opts.Lease)
		mu.Lock()
		left := until.Sub(now)
		mu.Unlock()
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), max(left, time.Millisecond))
		err := s.opts.Backend.Renew(rctx, claim.Key, claim.Token, now, next)
		rcancel()
		mu.Lock()
		defer mu.Unlock()
		switch {
		case stopped:
		case errors.Is(err, ErrNotOwner):
			cancel(ErrLeaseLost)
		case err == nil:
			until = next
			timer.Reset(every)
		case !s.opts.Now().Before(until): // renewals failed until the lease ran out
			cancel(ErrLeaseLost)
		default: // failed for now: try again soon
			timer.Reset(every)
		}
	})
	return ctx, func() {
		mu.Lock()
		stopped = true
		timer.Stop()
		mu.Unlock()
		cancel(nil)
	}
}
