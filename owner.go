package idem

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/seed094d4201/idem/backend"
)

// Which clock judges what. The backend's clock judges records: a lease
// lapses and an outcome expires when the backend says so. This process's
// monotonic clock judges its own trust in its leases (leaseTrust), and
// whether another owner is dead: a lapse on the backend's clock alone is
// no proof, since that clock can step forward past a live owner's lease,
// or back, holding a dead owner's key for the length of the step. So a
// store takes a key over from another owner (or answers ErrOutcomeUnknown
// for it) only on evidence no clock step can fake:
//
//   - the backend proved the owner dead (an interrupted record with no
//     lease: bolt found it pending at Open, under the file lock the owner
//     held), or the owner let the claim go for resumption (provenDead);
//   - a lapsed claim, seen unrenewed for watchLapsed on this process's
//     monotonic clock: a live owner renews every renewEvery, and its
//     renewal revives a lease a step made lapse (backend.Backend's Renew);
//     an owner cut off from the backend renews nothing, and has stopped
//     trusting its claim by then (leaseTrust);
//   - a claim the backend still holds pending, seen unrenewed for a whole
//     lease on this clock (its owner's, if the record shows a longer
//     one): its owner stopped trusting it by then (leaseTrust), whatever
//     the backend's clock says.

// watchLapsed is how long a lapsed claim must be seen unrenewed before it
// is taken for interrupted: a whole lease. A live owner's renewal (every
// quarter) shows well within it; and an owner whose renewals cannot get
// through (cut off from the backend) goes on trusting its claim for
// leaseTrust from when its last renewal that landed left, before this
// store first saw the record that renewal wrote: its trust has ended when
// the watch does, however far the backend's clock stepped forward. (A
// third of the lease, as it was, handed a cut-off owner's key to another
// store while fn still ran under a live context.)
func watchLapsed(lease time.Duration) time.Duration { return lease }

// watchPending is how long rec, a claim the backend holds pending, must be
// seen unrenewed before its owner is taken for dead: a whole lease, past
// any trust its owner could still have in it; and at least the lease its
// owner asked for, as far as rec shows it (its lease's end less its
// creation: the owner's lease, or more once renewed), for an owner whose
// Lease is longer than this store's (a rolling deploy that changes it)
// renews less often than this store's lease, and is alive. Only a clock
// stepped back between the claim and a renewal shows less.
func watchPending(lease time.Duration, rec backend.Record) time.Duration {
	return max(lease, rec.LeaseUntil.Sub(rec.CreatedAt))
}

// provenDead reports whether rec says its owner is dead or let it go, not
// only that its lease lapsed: a released token (its owner let it go for
// resumption: handOver, on any backend); or, interrupted, no lease to
// judge (the backend proved its owner dead); or the lease an owner's own
// lapse gives (letting a claim go for resumption, on a backend that keeps
// the store's clock: in the first second after lapsedAt); or the lease of
// a transactional claim committed without its outcome, never renewed,
// made at its claim's instant or a microsecond before. A lease that merely
// ends before the claim was made is no proof: a live owner's renewal
// gives one while the clock stands stepped back by more than the time
// since its claim. A shared backend's lapse ends at its server's now, and
// is watched as any other.
func provenDead(rec backend.Record) bool {
	if strings.HasPrefix(rec.Token, releasedPrefix) { // let go: handOver
		return rec.State != backend.StateCompleted
	}
	if rec.State != backend.StateInterrupted {
		return false
	}
	early := rec.CreatedAt.Sub(rec.LeaseUntil)
	return rec.LeaseUntil.IsZero() || rec.LeaseUntil.Before(lapsedAt.Add(time.Second)) || (early >= 0 && early <= time.Microsecond)
}

// unchanged reports whether b is a, as far as its owner's renewals go.
func unchanged(a, b backend.Record) bool {
	return a.Token == b.Token && a.State == b.State && a.LeaseUntil.Equal(b.LeaseUntil)
}

// awaitOwner waits on rec, key's record held by another owner (pending,
// or interrupted), until it settles or its owner is judged dead, polling
// with a backoff. It returns the record completed, State zero if it was
// released or changed hands (claim again), or interrupted with its owner
// judged dead; a claim the backend still held pending is then made to
// lapse there, so that a takeover or an operator's Forget can act on it.
// It gives up with ErrInProgress when the store closes or ctx ends.
func (s *Store[R]) awaitOwner(ctx context.Context, rec backend.Record) (backend.Record, error) {
	if provenDead(rec) {
		return s.judgedDead(ctx, rec) // a claim let go may still read pending
	}
	// A backend that stops answering must not hold Close up.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(s.stopping, cancel)()
	key := rec.Key
	since := time.Now() // when rec was first seen as it stands
	lease := s.opts.Lease
	wait := pollMin
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		watch := watchPending(lease, rec)
		if rec.State == backend.StateInterrupted {
			watch = watchLapsed(lease)
		}
		if time.Since(since) >= watch {
			return s.judgedDead(ctx, rec)
		}
		select {
		case <-timer.C:
		case <-s.stopping.Done():
			return backend.Record{}, errClosedWhileHeld
		case <-ctx.Done():
			if s.stopping.Err() != nil { // ctx ends with stopping too
				return backend.Record{}, errClosedWhileHeld
			}
			return backend.Record{}, fmt.Errorf("%w: %w", ErrInProgress, ctx.Err())
		}
		got, ok, err := s.b.Get(ctx, key, s.opts.Now())
		switch {
		case err != nil && s.stopping.Err() != nil:
			return backend.Record{}, errClosedWhileHeld
		case err != nil && ctx.Err() != nil:
			return backend.Record{}, fmt.Errorf("%w: %w", ErrInProgress, ctx.Err())
		case err != nil:
			return backend.Record{}, &BackendError{Op: "get", Err: err}
		case !ok:
			return backend.Record{}, nil
		case got.State == backend.StateCompleted:
			return got, nil
		case got.Token != rec.Token:
			return backend.Record{}, nil // another owner's claim now: claim again
		case provenDead(got):
			return got, nil
		case !unchanged(got, rec):
			rec, since = got, time.Now() // renewed: its owner is alive
		}
		wait = min(2*wait, pollMax, max(lease/12, pollMin))
		timer.Reset(wait)
	}
}

// errClosedWhileHeld is the answer of a call that waited for a key held
// by another owner (awaitOwner, recheck, a claim again) when the store
// closes.
var errClosedWhileHeld = fmt.Errorf("%w: %w: the store closed while another owner held the key", ErrInProgress, ErrClosed)

// judgedDead returns rec, whose owner this store has judged dead, as
// interrupted; a claim the backend still holds pending (its clock stepped
// back, or runs slow) is first made to lapse there, under its own token,
// so that the backend agrees.
func (s *Store[R]) judgedDead(ctx context.Context, rec backend.Record) (backend.Record, error) {
	if rec.State == backend.StatePending {
		s.lapse(ctx, rec)
		got, ok, err := s.b.Get(ctx, rec.Key, s.opts.Now())
		switch {
		case err != nil:
			return backend.Record{}, &BackendError{Op: "get", Err: err}
		case !ok || got.Token != rec.Token:
			return backend.Record{}, nil // settled meanwhile: claim again
		case got.State == backend.StateCompleted:
			return got, nil
		}
		rec = got
	}
	rec.State = backend.StateInterrupted
	return rec, nil
}
