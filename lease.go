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

// renewEvery is how often an owner renews its lease: a quarter of it, so
// that a store watching a lapsed claim for a whole lease (watchLapsed)
// sees a live owner's renewal land, with time for retries to spare.
func renewEvery(lease time.Duration) time.Duration { return lease / 4 }

// renew keeps l.claim's lease alive, its claim sent at sent: a quarter of
// the lease after each grant was asked for, it asks for the next. The lease
// is measured on this process's monotonic clock from the moment each
// request left (sent, for the claim): the backend grants it from a later
// instant, by whatever clock it keeps, so the owner always gives up first,
// and skew between clocks cannot make it trust a lapsed lease.
//
// l.ctx, the work's context (work, ended by endWork too), is cancelled
// with ErrLeaseLost when the claim turns out to be lost, or when the
// trusted lease runs out without a renewal getting through (a partition,
// a backend that does not answer), whatever the renewal call is doing. A
// renewal that fails is tried again every twelfth of the lease, each call
// bounded so that a retry can still land in time. l.end cancels l.ctx (the
// work is over) and leaves the renewals running; l.stop ends the renewals
// (and the context) and waits for none. The two are apart because a
// finished owner whose outcome is not yet recorded must keep its claim
// alive until it is. A renewal already in flight is counted in
// s.background, so Close waits for it, and its context ends when the store
// closes. Until its first renewal is due the lease waits in the store's
// queue (leaseQueue), under the queue's one timer: a fast fn costs no
// timer of its own and no goroutine.
func (l *lease[R]) renew(work context.Context, endWork context.CancelFunc, sent time.Time) {
	s := l.s
	l.ctx, l.cancel = context.WithCancelCause(work)
	l.endWork = endWork
	every := renewEvery(s.opts.Lease)
	l.until, l.next = sent.Add(leaseTrust(s.opts.Lease)), sent.Add(every)
	s.leases.add(l)
}

// A lease is the renewals of one durable claim: the store's queue until
// its first renewal is due, then a timer of its own, which fires at the
// next renewal or, while a renewal is in flight, at the moment the lease
// stops being trusted, whichever comes first.
type lease[R any] struct {
	s       *Store[R]
	claim   backend.Record  // the claim renewed; the Ticket points at it
	record  detached        // the record span's ctx without its cancellation, set by finishDurable: what the outcome is recorded under
	ctx     context.Context // the work's: cancelled with ErrLeaseLost
	cancel  context.CancelCauseFunc
	endWork context.CancelFunc // ends the work's context below ctx (its timeout); may be nil

	mu       sync.Mutex
	stopped  bool        // guarded by mu; no renewal starts once set (stop, or the claim lost)
	renewing bool        // guarded by mu: a renewal call is in flight
	renewals int         // guarded by mu: renewals started
	until    time.Time   // guarded by mu: when the lease stops being trusted
	next     time.Time   // guarded by mu: when the next renewal is due
	timer    *time.Timer // guarded by mu: made by the first fire (arm), Reset while not stopped

	// qidx is the lease's index in the store's leaseQueue until its first
	// renewal is due, -1 after; guarded by that queue's mu.
	qidx int
}

// end ends the work's context; the renewals go on until stop.
func (l *lease[R]) end() {
	l.cancel(nil)
	if l.endWork != nil {
		l.endWork()
	}
}

// stop ends the renewals and the work's context; a nil lease has none.
func (l *lease[R]) stop() {
	if l == nil {
		return
	}
	l.mu.Lock()
	l.stopped = true
	if l.timer != nil {
		l.timer.Stop()
	}
	l.mu.Unlock()
	l.s.leases.remove(l)
	l.cancel(nil)
}

// fire runs on the timer's goroutine (the queue's, the first time): it
// ends the trust if the lease has run out, and starts the renewal that is
// due.
func (l *lease[R]) fire() {
	l.mu.Lock()
	if l.stopped {
		l.mu.Unlock()
		return
	}
	now := time.Now()
	lapsed := !now.Before(l.until)
	if lapsed {
		l.cancel(ErrLeaseLost)
	}
	if l.renewing || now.Before(l.next) { // the renewal in flight reschedules
		if !l.renewing {
			l.schedule(lapsed)
		}
		l.mu.Unlock()
		return
	}
	l.renewing = true
	l.renewals++
	// Each renewal asks for a nanosecond more than the last, so that it
	// moves the record's lease even on a clock that stands still (a
	// test's): a store watching the claim sees its owner alive (owner.go).
	grant := l.s.opts.Lease + time.Duration(l.renewals)
	l.s.background.Add(1) // before stop can return: Close waits for this call
	left := l.until.Sub(now)
	if !lapsed { // the trust must end on time, whatever the call does
		l.arm(left)
	}
	l.mu.Unlock()
	defer l.s.background.Done()

	// A renewal that lands after the outcome was recorded is refused by
	// the backend (the record is no longer pending), which is harmless.
	// Bounded by the trust left, or a retry's worth once it has run out.
	// A Backend that ends this goroutine (runtime.Goexit) made a renewal
	// that failed: the deferred call still takes its result, or the lease
	// would stay renewing, and never renew again. (A panic is the guarded
	// Backend's error.)
	s := l.s
	lease := s.opts.Lease
	every := renewEvery(lease)
	sent := time.Now()
	err := errRenewalExited
	defer func() { l.renewed(sent, err) }()
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(l.ctx), max(min(every, left), lease/12))
	unhook := context.AfterFunc(s.closing, rcancel)
	err = s.b.Renew(rctx, l.claim.Key, l.claim.Token, s.opts.Now(), grant)
	unhook()
	rcancel()
}

// errRenewalExited is a renewal's result when the Backend's Renew ended
// its goroutine (runtime.Goexit) before it returned.
var errRenewalExited = errors.New("idem: the Backend's Renew ended its goroutine")

// renewed takes the result of the renewal sent at sent, and schedules
// what comes next.
func (l *lease[R]) renewed(sent time.Time, err error) {
	lease := l.s.opts.Lease
	l.mu.Lock()
	defer l.mu.Unlock()
	l.renewing = false
	switch {
	case l.stopped:
		return
	case errors.Is(err, backend.ErrNotOwner):
		// Another owner holds the key, or it was settled: nothing more to
		// renew. Stopped, so that neither the timer armed for the end of
		// the trust nor a fire already waiting for l.mu starts a renewal
		// under the lost token.
		l.cancel(ErrLeaseLost)
		l.stopped = true
		if l.timer != nil {
			l.timer.Stop()
		}
		return
	case err == nil:
		l.until, l.next = sent.Add(leaseTrust(lease)), sent.Add(renewEvery(lease))
	default: // failed for now: try again soon; the trust still ends at until
		l.next = time.Now().Add(lease / 12)
	}
	l.schedule(!time.Now().Before(l.until))
}

// schedule sets the timer for the next renewal, or for the end of the
// trust if that comes first and has not come yet. l.mu is held.
func (l *lease[R]) schedule(lapsed bool) {
	at := l.next
	if !lapsed && l.until.Before(at) {
		at = l.until
	}
	l.arm(time.Until(at))
}

// arm sets the lease's own timer to fire in d, making it the first time.
// l.mu is held.
func (l *lease[R]) arm(d time.Duration) {
	if l.timer == nil {
		l.timer = time.AfterFunc(d, l.fire)
		return
	}
	l.timer.Reset(d)
}

// trusted reports whether a lease asked for at sent may still be trusted.
func (s *Store[R]) trusted(sent time.Time) bool {
	return time.Since(sent) < leaseTrust(s.opts.Lease)
}
