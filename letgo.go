package idem

import (
	"context"
	"errors"
	"time"

	"github.com/seed094d4201/idem/backend"
)

// letGo gives up claim after a failure before commit: it is released, or,
// with Resume and a recorded step (this run's, or resumed with the claim),
// kept at its recovery point, its steps recorded, for the next call to
// resume; its lease is then made to lapse now, so that call need not wait
// it out (if that fails, it lapses on its own). The claim's renewals must
// have ended; one already in flight may yet land after the lapse and give
// the claim back a lease that nobody renews, for the next call to wait
// out and then watch: once any such call has ended (each is bounded by a
// quarter of the lease, lease.fire), a claim found pending again under its
// token is made to lapse again, in the background. (Only then: on a
// shared backend, whose lapse is no mark, another lapse would restart the
// watch of the next call.)
func (s *Store[R]) letGo(ctx context.Context, claim backend.Record, op *operation) error {
	if s.opts.Resume && (len(claim.Steps) > 0 || op.hasSteps()) {
		s.lapse(ctx, claim)
		if s.handOver(ctx, claim) {
			return nil // no renewal can revive it: its token is no longer ours
		}
		s.startBackground(func() { s.lapseAgain(claim) })
		return nil
	}
	return s.releaseOrLater(ctx, claim.Key, claim.Token)
}

// takeLease returns t's lease, which its caller must stop (a nil lease's
// stop does nothing), and leaves t without it to stop; nil if t has none,
// or it was taken.
func (t *Ticket[R]) takeLease() *lease[R] {
	if t.leaseTaken {
		return nil
	}
	t.leaseTaken = true
	return t.lease
}

// endWork ends t's work context and its timeout; a durable claim's renewals
// go on until its lease is stopped.
func (t *Ticket[R]) endWork() {
	if t.cancel != nil {
		t.cancel()
	}
	if t.lease != nil {
		t.lease.end()
	}
}

// lapse ends claim's lease now, keeping its record and steps, so that the
// next call resumes it at once rather than waiting the lease out. It is a
// Renew whose lease ends at lapsedAt by the store's clock, long past, so
// that a backend on the store's clock sees it lapsed whatever that clock
// does next (stands still, as a test's does, or steps back), or a
// nanosecond after a server's now. If it fails, the lease lapses on its
// own. A Backend that ends the goroutine (runtime.Goexit) in it leaves
// the lapse to be tried once more in the background, so that the claim
// is not held for a whole lease that nobody renews.
func (s *Store[R]) lapse(ctx context.Context, claim backend.Record) {
	s.tryLapse(ctx, claim, true)
}

// tryLapse is lapse, tried again in the background if again is set and
// the Backend ends the goroutine.
func (s *Store[R]) tryLapse(ctx context.Context, claim backend.Record, again bool) {
	returned := false
	defer exiting(&returned, func() {
		if again {
			s.startBackground(func() { s.tryLapse(s.closing, claim, false) })
		}
	})
	ctx, cancel := context.WithTimeout(ctx, s.opts.SettleTimeout)
	defer cancel()
	_ = s.b.Renew(ctx, claim.Key, claim.Token, lapsedAt, time.Nanosecond)
	returned = true
}

// handOver gives claim, just made to lapse, a released token (resumed
// under it with a lease already over), so that a store that finds it,
// on any backend, takes it over at once: no clock can fake that mark, and
// no renewal of the old token can revive it. It reports whether the
// record now carries it; if not, the lapse alone stands.
func (s *Store[R]) handOver(ctx context.Context, claim backend.Record) bool {
	if s.b.st == nil {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, s.opts.SettleTimeout)
	defer cancel()
	// A server's lapse ends a moment after its now (a millisecond, on
	// Redis): until then the claim is not yet resumable.
	for try := 0; ; try++ {
		_, err := s.b.Resume(ctx, claim.Key, claim.Token, releasedPrefix+newToken(), s.opts.Now(), time.Nanosecond)
		if err == nil || !errors.Is(err, backend.ErrNotOwner) || try == 10 || !pause(ctx.Done(), time.Millisecond) {
			return err == nil
		}
	}
}

// releasedPrefix starts the token of a claim its owner let go for
// resumption (handOver).
const releasedPrefix = "released-"

// lapseAgain is letGo's second lapse of claim, if a late renewal revived it.
func (s *Store[R]) lapseAgain(claim backend.Record) {
	if !pause(s.closing.Done(), renewEvery(s.opts.Lease)+time.Millisecond) {
		return
	}
	ctx, cancel := context.WithTimeout(s.closing, s.opts.SettleTimeout)
	defer cancel()
	rec, ok, err := s.b.Get(ctx, claim.Key, s.opts.Now())
	if err == nil && ok && rec.Token == claim.Token && rec.State == backend.StatePending {
		s.lapse(s.closing, claim)
	}
}

// lapsedAt is the instant a lapsed lease is given: the first second of
// Unix time, which every backend can store.
var lapsedAt = time.Unix(1, 0).UTC()
