package idem

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/seed094d4201/idem/backend"
)

// ErrLeaseLost is the cause of fn's context when the store stops trusting
// fn's durable claim: another owner took the key, or no renewal got
// through before the lease could lapse. The outcome of such an fn is
// refused (backend.ErrNotOwner) if another owner took the key meanwhile.
var ErrLeaseLost = errors.New("idem: lease lost: the claim can no longer be trusted to hold the key")

// leaseTrust is how long after a request left an owner trusts the lease it
// asks for: the lease less a tenth, for timers that fire late, pauses, and
// clocks that run at slightly different rates.
func leaseTrust(lease time.Duration) time.Duration { return lease - lease/10 }

// renew keeps claim's lease alive: a third of the lease after each grant
// was asked for, it asks for the next. The lease is measured on this
// process's monotonic clock from the moment each request left (sent, for
// the claim): the backend grants it from a later instant, by whatever clock
// it keeps, so the owner always gives up first, and skew between clocks
// cannot make it trust a lapsed lease.
//
// The returned context is cancelled with ErrLeaseLost when the claim turns
// out to be lost, or when the trusted lease runs out without a renewal
// getting through (a partition, a backend that does not answer), whatever
// the renewal call is doing. A renewal that fails is tried again every
// twelfth of the lease, each call bounded so that a retry can still land
// in time. end cancels the returned context (the work is over) and leaves
// the renewals running; stop ends the renewals (and the context) and waits
// for none. The two are apart because a finished owner whose outcome is
// not yet recorded must keep its claim alive until it is. A renewal already
// in flight is counted in s.background, so Close waits for it, and its
// context ends when the store closes. A fast fn costs two timers and no
// goroutine.
func (s *Store[R]) renew(ctx context.Context, claim backend.Record, sent time.Time) (_ context.Context, end, stop func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	lease := s.opts.Lease
	every, retry, trust := lease/3, lease/12, leaseTrust(lease)
	var (
		mu      sync.Mutex
		stopped bool              // guarded by mu; no renewal starts once set
		until   = sent.Add(trust) // guarded by mu: when the lease stops being trusted
		renewal *time.Timer       // guarded by mu: Reset while not stopped
		expiry  *time.Timer       // guarded by mu: fires at until; Reset when it moves
	)
	mu.Lock()
	defer mu.Unlock()
	expiry = time.AfterFunc(time.Until(until), func() {
		mu.Lock()
		defer mu.Unlock()
		if !stopped && !time.Now().Before(until) {
			cancel(ErrLeaseLost)
		}
	})
	renewal = time.AfterFunc(time.Until(sent.Add(every)), func() {
		mu.Lock()
		if stopped {
			mu.Unlock()
			return
		}
		s.background.Add(1) // before stop can return: Close waits for this call
		left := time.Until(until)
		mu.Unlock()
		defer s.background.Done()

		// A renewal that lands after the outcome was recorded is refused by
		// the backend (the record is no longer pending), which is harmless.
		// Bounded by the trust left, or a retry's worth once it has run out.
		sent := time.Now()
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), max(min(every, left), retry))
		unhook := context.AfterFunc(s.closing, rcancel)
		err := s.opts.Backend.Renew(rctx, claim.Key, claim.Token, s.opts.Now(), lease)
		unhook()
		rcancel()

		mu.Lock()
		defer mu.Unlock()
		switch {
		case stopped:
		case errors.Is(err, backend.ErrNotOwner):
			cancel(ErrLeaseLost)
		case err == nil:
			until = sent.Add(trust)
			expiry.Reset(time.Until(until))
			renewal.Reset(time.Until(sent.Add(every)))
		default: // failed for now: try again soon; expiry ends the trust
			renewal.Reset(retry)
		}
	})
	return ctx, func() { cancel(nil) }, func() {
		mu.Lock()
		stopped = true
		renewal.Stop()
		expiry.Stop()
		mu.Unlock()
		cancel(nil)
	}
}

// trusted reports whether a lease asked for at sent may still be trusted.
func (s *Store[R]) trusted(sent time.Time) bool {
	return time.Since(sent) < leaseTrust(s.opts.Lease)
}
