package idem

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/seed094d4201/idem/backend"
)

// beginDurable claims t's key in the Backend for t, whose entry this
// process's memory has already made the key's only owner here, or learns
// its fate: a replay (filled into t), or an error. Either way t's entry is
// settled unless t comes back owning a durable claim, whose lease it then
// renews until Finish. A wait for another process's execution ends with
// ctx; the waiters on t's entry then claim again under their own contexts.
func (s *Store[R]) beginDurable(ctx context.Context, t *Ticket[R]) error {
	e := t.e
	cctx, endClaim := s.span(ctx, "idem.claim", e.key)
	claim, sent, err := s.acquire(cctx, t)
	if err == nil && claim.Token != "" {
		if s.trusted(sent) {
			// From here the claim is t's: were the Observer to end this
			// goroutine, begin's guard releases it. The lease holds it,
			// so that a new key allocates one object for both.
			l := &lease[R]{s: s, claim: claim}
			t.claim = &l.claim
			s.table.confirm(e)
			endClaim(nil)
			if s.b.st != nil && s.opts.Resume {
				t.op.resumeWith(s.b, claim, s.opts.Now, s.opts.Lease, s.opts.SettleTimeout, s.stopping)
			}
			t.startSpan()
			work, endWork := s.workContext(t.ctx, nil)
			l.renew(work, endWork, sent)
			t.work, t.lease = l.ctx, l
			return nil
		}
		// The claim's reply came too late to trust its lease: another
		// store may already take the key for interrupted, so the work
		// must not start. Settled in the background: the caller's wait
		// is bounded by its own ctx.
		if len(claim.Steps) > 0 { // resumed: keep its recovery point
			resumed := claim // captured apart, so that claim stays on the stack
			s.startBackground(func() { s.lapse(s.closing, resumed) })
		} else {
			s.releaseLater(claim.Key, claim.Token)
		}
		err = &BackendError{Op: "claim", Err: errors.New("the lease ran out before the work could start")}
	}
	if errors.Is(err, ErrPayloadMismatch) {
		endClaim(nil) // the claim found the key's answer: a different payload; nothing failed
	} else {
		endClaim(err)
	}
	t.e = nil
	if err != nil {
		// A caller whose ctx ended before it learnt the key's fate answers
		// as any caller whose ctx ended: the claim may have landed, and
		// another attempt may run. A backend that failed for another
		// reason (unreachable, broken) stays a *BackendError, even if ctx
		// has ended since. The waiters behind it, whose own contexts may
		// still run, claim again.
		if cerr := ctx.Err(); cerr != nil && !errors.Is(err, ErrInProgress) && errors.Is(err, cerr) {
			err = fmt.Errorf("%w: %w", ErrInProgress, cerr)
		}
		e.err = err
		if errors.Is(err, ErrInProgress) {
			e.err = errYield
		}
		s.table.release(e)
		return err
	}
	e.val, e.err, e.shared = t.val, t.err, true
	s.table.release(e) // the backend remembers it; memory keeps in-flight keys only
	return nil
}

// acquire claims t's key in the Backend and returns the claim and when it
// was sent, or answers from the record it finds there: a completed one is
// decoded into t (and the claim returned is zero), anything else is an
// error.
func (s *Store[R]) acquire(ctx context.Context, t *Ticket[R]) (backend.Record, time.Time, error) {
	b := s.b
	key, fp := t.e.key, t.e.fp
	retried := false
	for {
		claim := backend.Record{Key: key, Fingerprint: fp, Token: newToken(), State: backend.StatePending}
		// The lease is trusted from before the claim leaves: whatever clock
		// the backend uses, it cannot have granted the lease any earlier.
		sent := time.Now()
		rec, claimed, err := s.claimDurable(ctx, claim)
		switch {
		case err != nil:
			return backend.Record{}, sent, err
		case claimed:
			return rec, sent, nil
		}
		if rec.Fingerprint != fp {
			return backend.Record{}, sent, ErrPayloadMismatch
		}
		if rec.State != backend.StateCompleted {
			// In flight through another store, most likely another
			// process, or interrupted: wait for its outcome, or until its
			// owner is judged dead (owner.go).
			if rec, err = s.awaitOwner(ctx, rec); err != nil {
				return backend.Record{}, sent, err
			}
			if rec.State == 0 {
				continue // released, or changed hands: claim again
			}
		}
		switch {
		case rec.Fingerprint != fp:
			return backend.Record{}, sent, ErrPayloadMismatch
		case rec.State == backend.StateCompleted:
			t.val, t.err = s.decode(rec)
			return backend.Record{}, sent, nil
		}
		if b.st != nil && s.opts.Resume {
			// Take the claim over, steps and all, and run on from its last
			// recovery point (from the start, if it recorded none).
			sent = time.Now()
			resumed, err := s.resumeDurable(ctx, key, rec.Token)
			if errors.Is(err, backend.ErrNotOwner) {
				continue // another store resumed it, or it changed: look again
			}
			return resumed, sent, err
		}
		if !s.opts.RetryInterrupted || retried {
			return backend.Record{}, sent, ErrOutcomeUnknown
		}
		// RetryInterrupted: treat the interrupted claim as failed before
		// commit. Its token is compared, so if another store took it over in
		// the meantime this release fails and the claim below finds theirs.
		if err := b.Release(ctx, key, rec.Token); err != nil && !errors.Is(err, backend.ErrNotOwner) {
			return backend.Record{}, sent, &BackendError{Op: "release", Err: err}
		}
		retried = true
	}
}

// claimDurable claims claim.Key in the backend. A standing record that holds
// claim's own token is this claim: an earlier attempt landed and its reply
// was lost (a client library that retried, or the read-back below). A claim
// that fails may still have landed, or may yet land (a request delayed on
// a connection the client gave up on): it is read back, and unless it is
// found in time to run fn under it, it is released in the background as
// soon as it shows up, rather than left to strand the key.
//
// A Backend that ends the goroutine (runtime.Goexit) leaves the claim's
// fate unknown too: it is released in the background as the goroutine
// ends.
func (s *Store[R]) claimDurable(ctx context.Context, claim backend.Record) (rec backend.Record, claimed bool, err error) {
	returned := false
	defer exiting(&returned, func() { s.releaseLater(claim.Key, claim.Token) })
	rec, claimed, err = s.tryClaim(ctx, claim)
	returned = true
	return rec, claimed, err
}

// tryClaim is claimDurable, but for a goroutine the Backend ends.
func (s *Store[R]) tryClaim(ctx context.Context, claim backend.Record) (backend.Record, bool, error) {
	b := s.b
	// A claim against a backend that never answers must not hold Close up.
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(s.stopping, cancel)()
	rec, claimed, err := b.Claim(cctx, claim, s.opts.Now(), s.opts.Lease)
	if err == nil {
		err = checkClaim(claim, rec, claimed)
	}
	switch {
	case err == nil && (claimed || rec.Token != claim.Token):
		return rec, claimed, nil
	case err == nil && rec.State == backend.StatePending:
		return rec, true, nil // its own claim, landed by an earlier attempt
	case err == nil: // its own claim, lapsed already: fn must not run under it
		s.releaseLater(claim.Key, claim.Token)
		return backend.Record{}, false, &BackendError{Op: "claim", Err: errors.New("the claim's lease lapsed before its reply arrived")}
	}
	if refused(err) { // nothing was written
		return backend.Record{}, false, &BackendError{Op: "claim", Err: err}
	}
	// Read back under the caller's ctx: its wait is bounded by its own
	// deadline, and a claim still unknown then is settled in the
	// background.
	rctx, cancel := context.WithTimeout(cctx, s.opts.SettleTimeout)
	defer cancel()
	rec, found, gerr := b.Get(rctx, claim.Key, s.opts.Now())
	if gerr == nil && found && rec.Token == claim.Token && rec.State == backend.StatePending {
		return rec, true, nil
	}
	s.releaseLater(claim.Key, claim.Token)
	return backend.Record{}, false, &BackendError{Op: "claim", Err: err}
}

// resumeDurable takes key's interrupted claim, held by old, over under a
// fresh token, steps and all, and returns the claim, or an error (matching
// backend.ErrNotOwner if another store resumed it, or it changed). A
// Resume whose reply is lost after it landed is read back, and run under
// if it is ours, as claimDurable does. A Backend that ends the goroutine
// (runtime.Goexit) in the Resume or its read-back leaves the takeover's
// fate unknown: its lease is made to lapse in the background, keeping
// the steps, so that the next call resumes it at once rather than wait a
// lease for a claim nobody runs.
func (s *Store[R]) resumeDurable(ctx context.Context, key, old string) (claim backend.Record, err error) {
	b := s.b
	token := newToken()
	returned := false
	defer exiting(&returned, func() {
		s.startBackground(func() { s.lapse(s.closing, backend.Record{Key: key, Token: token}) })
	})
	resumed, err := b.Resume(ctx, key, old, token, s.opts.Now(), s.opts.Lease)
	switch {
	case err == nil && (resumed.Key != key || resumed.Token != token || resumed.State != backend.StatePending):
		returned = true
		return backend.Record{}, &BackendError{Op: "resume", Err: fmt.Errorf("%w: a resume of %q answered with another key, token or state", errMalformed, key)}
	case err == nil:
		returned = true
		return resumed, nil
	case errors.Is(err, backend.ErrNotOwner):
		returned = true
		return backend.Record{}, err
	}
	rctx, cancel := context.WithTimeout(ctx, s.opts.SettleTimeout)
	got, found, gerr := b.Get(rctx, key, s.opts.Now())
	cancel()
	returned = true
	if gerr == nil && found && got.Token == token && got.State == backend.StatePending {
		return got, nil
	}
	return backend.Record{}, &BackendError{Op: "resume", Err: err}
}

// errMalformed is the cause of a *BackendError for a Backend whose answer
// breaks its contract; a bug in the backend, never a success.
var errMalformed = errors.New("malformed answer from the Backend")

// checkClaim returns an error unless rec is a valid answer to claim: the
// claim itself if claimed, else a record of the key with a token and a
// state.
func checkClaim(claim, rec backend.Record, claimed bool) error {
	switch {
	case rec.Key != claim.Key:
		return fmt.Errorf("%w: claim of %q answered with a record of %q", errMalformed, claim.Key, rec.Key)
	case claimed && (rec.Token != claim.Token || rec.State != backend.StatePending || rec.Fingerprint != claim.Fingerprint):
		return fmt.Errorf("%w: a claim of %q reported won with another token, state or fingerprint", errMalformed, claim.Key)
	case rec.Token == "":
		return fmt.Errorf("%w: the record of %q has no token", errMalformed, claim.Key)
	case rec.State != backend.StatePending && rec.State != backend.StateCompleted && rec.State != backend.StateInterrupted:
		return fmt.Errorf("%w: the record of %q is in state %v", errMalformed, claim.Key, rec.State)
	}
	return nil
}

// replayWhenFull answers a call that found memory full (MaxKeys counts the
// keys held in memory: those in flight, and outcomes pinned there): a key
// whose outcome the backend remembers needs no room to be replayed. Any
// other key is refused with ErrFull.
func (s *Store[R]) replayWhenFull(ctx context.Context, key string, fp Fingerprint) (val R, ferr, err error) {
	rec, ok, err := s.b.Get(ctx, key, s.opts.Now())
	switch {
	case err != nil:
		return val, nil, &BackendError{Op: "get", Err: err}
	case ok && rec.Fingerprint != fp:
		return val, nil, ErrPayloadMismatch
	case ok && rec.State == backend.StateCompleted:
		val, ferr = s.decode(rec)
		return val, ferr, nil
	}
	return val, nil, ErrFull
}

// Polling bounds for a key in flight elsewhere: the first wait, and the most
// any wait grows to.
const (
	pollMin = 5 * time.Millisecond
	pollMax = 500 * time.Millisecond
)

// finishDurable records the outcome of t's durable claim: a final outcome
// is completed, anything else releases the claim. Both use a context that
// the work's timeout cannot end, so a finished operation is never lost for
// want of time to record it, and the lease is renewed until the outcome is
// settled. A final outcome the backend could not record comes back as
// unrecorded (the caller answers the outcome all the same), and pin
// reports that its record stays pending: memory must hold the outcome meanwhile
// (the store goes on trying to record it, its lease still renewed), or
// this process would find the key pending. A release that cannot get
// through is finished in the background instead. finishDurable takes
// t's lease over once nothing of the user's runs any more.
func (s *Store[R]) finishDurable(t *Ticket[R], val R, err error, final bool) (unrecorded *NotRecordedError, pin bool, releaseErr error) {
	var record context.Context
	if t.lease != nil {
		// Under t.ctx as it is now, the "idem.record" span's: the
		// Backend's writes are that phase's (Observer.Span).
		t.lease.record = detached{parent: t.ctx}
		record = &t.lease.record
	} else { // not renewed yet: never, once the claim is t's
		record = context.WithoutCancel(t.ctx)
	}
	claim := *t.claim
	// The work is over: its context ends now, as a finished ticket's, and
	// not later with ErrLeaseLost when a renewal lands on the recorded
	// outcome (no longer pending, so refused as another owner's).
	t.endWork()
	if !final {
		// Renewals end first, so that none can land after the claim's
		// lease was made to lapse.
		t.takeLease().stop()
		if rerr := s.letGo(record, claim, t.op); rerr != nil {
			return nil, false, fmt.Errorf("idem: releasing key in backend (it will be released once the backend answers): %w", rerr)
		}
		return nil, false, nil
	}
	done := claim
	rerr := s.encode(&done, val, err) // the Codec: the user's code
	encoded := rerr == nil
	var at time.Time
	if encoded {
		// A Backend that ends the goroutine (runtime.Goexit) in the write
		// leaves the outcome's fate unknown: it goes on being recorded in
		// the background, its claim's lease renewed till then, as an
		// outcome the Backend failed to take is. (Held in memory instead
		// for as long as the store lives, it stayed unrecorded, and other
		// processes waited on its claim for as long.) finish then settles
		// the entry unpinned: callers here read the Backend, which holds
		// the claim until the outcome is recorded.
		returned := false
		defer exiting(&returned, func() {
			if at.IsZero() { // Options.Now ended the goroutine: the system clock answers, as for one that panics
				at = time.Now()
			}
			s.completeLater(done, at, t.e, t.takeLease())
		})
		// The outcome's TTL runs from now, when it was known, however
		// late a write lands: one that landed after the clock stepped
		// back would be remembered for less than a TTL once the clock
		// steps forward again.
		at = s.opts.Now()
		rerr = s.complete(record, done, at)
		returned = true
	}
	l := t.takeLease()
	if rerr == nil {
		l.stop()
		return nil, false, nil
	}
	// Never release a key after the work succeeded: it stays claimed
	// (durably pending, interrupted after a restart) and memory replays it
	// while the store goes on trying to record it, renewing its lease so
	// that no other store takes it for interrupted. Unless the claim was
	// lost: then the backend holds another owner's outcome, which later
	// callers read.
	switch {
	case errors.Is(rerr, backend.ErrNotOwner):
		l.stop()
		return &NotRecordedError{Err: rerr}, false, nil
	case encoded:
		s.completeLater(done, at, t.e, l)
	default:
		s.holdLease(l)
	}
	return &NotRecordedError{Err: rerr}, true, nil
}

// newToken returns a random ownership token for one claim.
func newToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported platforms
	return hex.EncodeToString(b[:])
}
