package idem

import (
	"context"
	"errors"
	"sync"
	"time"
)

// ErrLeaseLost is the cause of fn's context when the store stops trusting
// fn's durable claim: another owner took the key, or renewals failed until
// the lease was about to lapse. The outcome of such an fn is refused
// (ErrNotOwner) if another owner took the key meanwhile.
var ErrLeaseLost = errors.New("idem: lease lost: another owner holds the key")

// leaseMargin is how long before its lease could lapse, by the backend's
// clock, that an owner stops trusting it: a tenth of the lease, for timers
// that fire late, pauses, and clocks that run at slightly different rates.
func leaseMargin(lease time.Duration) time.Duration { return lease / 10 }

// renew keeps claim's lease alive while fn runs: every third of the lease it
// extends it. If the claim turns out to be lost, or renewals keep failing (a
// partition) until the lease is about to lapse, it cancels the returned
// context with ErrLeaseLost: past that point another store may take the key
// for interrupted. stop ends the renewals. A fast fn costs one timer and no
// goroutine.
//
// The lease is measured on this process's monotonic clock from the moment
// each request was sent (sent, for the claim): the backend grants it from a
// later instant, by whatever clock it keeps, so the owner always gives up
// first, and skew between clocks cannot make it trust a lapsed lease.
func (s *Store[R]) renew(ctx context.Context, claim Record, sent time.Time) (_ context.Context, stop func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	lease := s.opts.Lease
	every := lease / 3
	trust := lease - leaseMargin(lease)
	var (
		mu      sync.Mutex
		stopped bool              // guarded by mu
		timer   *time.Timer       // guarded by mu: set, and Reset while not stopped
		until   = sent.Add(trust) // guarded by mu: when the lease stops being trusted
	)
	mu.Lock()
	defer mu.Unlock()
	timer = time.AfterFunc(every, func() {
		// A renewal that lands after the outcome was recorded is refused by
		// the backend (the record is no longer pending), which is harmless.
		sent := time.Now()
		mu.Lock()
		left := until.Sub(sent)
		mu.Unlock()
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), max(left, time.Millisecond))
		err := s.opts.Backend.Renew(rctx, claim.Key, claim.Token, s.opts.Now(), lease)
		rcancel()
		mu.Lock()
		defer mu.Unlock()
		switch {
		case stopped:
		case errors.Is(err, ErrNotOwner):
			cancel(ErrLeaseLost)
		case err == nil:
			until = sent.Add(trust)
			timer.Reset(every)
		case !time.Now().Before(until): // renewals failed until the lease ran out
			cancel(ErrLeaseLost)
		default: // failed for now: try again soon, but not past the lease
			timer.Reset(min(every, time.Until(until)))
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
