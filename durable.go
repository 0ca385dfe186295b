package idem

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"
)

// executeDurable claims key in the Backend and runs fn, or answers from the
// record it finds there. It runs once per key per process at a time: the
// memory table has already made this caller the key's only owner here. pin
// reports an outcome that the backend could not settle (record or release),
// so that its record stays pending: memory must hold the outcome for as long
// as the store lives, or this process would find the key pending forever.
func (s *Store[R]) executeDurable(ctx context.Context, key string, fp Fingerprint, fn func(context.Context) (R, error)) (val R, err error, pin bool) {
	b := s.opts.Backend
	retried := false
	for {
		now := s.opts.Now()
		claim := Record{Key: key, Fingerprint: fp, Token: newToken(), State: StatePending, CreatedAt: now, LeaseUntil: now.Add(s.opts.Lease)}
		rec, claimed, err := b.Claim(ctx, claim, now)
		switch {
		case err != nil:
			return val, &BackendError{Op: "claim", Err: err}, false
		case claimed:
			return s.runClaimed(ctx, claim, fn)
		}
		if rec.Fingerprint != fp {
			return val, ErrPayloadMismatch, false
		}
		if rec.State == StatePending && !rec.Lapsed(now) {
			// In flight through another store, most likely another process:
			// wait for its outcome.
			if rec, err = s.awaitSettled(ctx, key); err != nil {
				return val, err, false
			}
			if rec.State == 0 {
				continue // released: claim again
			}
		}
		switch {
		case rec.Fingerprint != fp:
			return val, ErrPayloadMismatch, false
		case rec.State == StateCompleted:
			val, err = s.decode(rec)
			return val, err, false
		case !s.opts.RetryInterrupted || retried:
			return val, ErrOutcomeUnknown, false
		}
		// RetryInterrupted: treat the interrupted claim as failed before
		// commit. Its token is compared, so if another store took it over in
		// the meantime this release fails and the claim below finds theirs.
		if err := b.Release(ctx, key, rec.Token); err != nil && !errors.Is(err, ErrNotOwner) {
			return val, fmt.Errorf("idem: releasing interrupted key in backend: %w", err), false
		}
		retried = true
	}
}

// Polling bounds for a key in flight elsewhere: the first wait, and the most
// any wait grows to.
const (
	pollMin = 5 * time.Millisecond
	pollMax = 500 * time.Millisecond
)

// awaitSettled polls key's record, with a backoff, until it is no longer a
// pending claim with a live lease, and returns it (State zero if the claim
// was released). It gives up with ErrInProgress when the store closes or ctx
// ends; the callers waiting on this execution leave on their own contexts.
func (s *Store[R]) awaitSettled(ctx context.Context, key string) (Record, error) {
	wait := pollMin
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		select {
		case <-timer.C:
		case <-s.stop:
			return Record{}, fmt.Errorf("%w: store closed while another owner held the key", ErrInProgress)
		case <-ctx.Done():
			return Record{}, fmt.Errorf("%w: %w", ErrInProgress, ctx.Err())
		}
		rec, ok, err := s.opts.Backend.Get(ctx, key)
		switch {
		case err != nil:
			return Record{}, &BackendError{Op: "get", Err: err}
		case !ok:
			return Record{}, nil
		case rec.State != StatePending || rec.Lapsed(s.opts.Now()):
			return rec, nil
		}
		wait = min(2*wait, pollMax)
		timer.Reset(wait)
	}
}

// runClaimed runs fn under the durable claim and records its outcome: a final
// outcome is completed, anything else releases the claim. Both use a context
// that fn's timeout cannot end, so a finished operation is never lost for
// want of time to record it.
func (s *Store[R]) runClaimed(ctx context.Context, claim Record, fn func(context.Context) (R, error)) (val R, err error, pin bool) {
	b := s.opts.Backend
	record := context.WithoutCancel(ctx)
	ctx, stopRenewing := s.renew(ctx, claim)
	defer stopRenewing()
	settled := false
	defer func() {
		if !settled { // fn called runtime.Goexit: it failed before commit
			_ = b.Release(record, claim.Key, claim.Token)
		}
	}()
	val, err, returned := call(ctx, fn)
	stopRenewing()
	settled = true
	if !returned || !isFinalOutcome(err) {
		if rerr := b.Release(record, claim.Key, claim.Token); rerr != nil {
			// Unless the claim was lost anyway, the record stays pending:
			// pin the failure so this process answers it rather than "in
			// progress" until a restart or lapsed lease interrupts the key.
			return val, errors.Join(err, fmt.Errorf("idem: releasing key in backend: %w", rerr)), !errors.Is(rerr, ErrNotOwner)
		}
		return val, err, false
	}

	done := claim
	done.State, done.ExpiresAt, done.LeaseUntil = StateCompleted, s.opts.Now().Add(s.opts.TTL), time.Time{}
	rerr := s.Encode(&done, val, err)
	if rerr == nil {
		rerr = b.Complete(record, done)
	}
	if rerr != nil {
		// Never release a key after fn succeeded: it stays claimed (durably
		// pending, interrupted after a restart) and memory replays it for as
		// long as the store lives. Unless the claim was lost: then the
		// backend holds another owner's outcome, which later callers read.
		return val, errors.Join(err, &NotRecordedError{Err: rerr}), !errors.Is(rerr, ErrNotOwner)
	}
	return val, err, false
}

// Options returns the options the store runs with, defaults applied.
func (s *Store[R]) Options() Options { return s.opts }

// Decode returns the outcome a completed record holds, decoded with the
// store's Codec: the result, and for a final error an error with its
// message that IsFinal recognises. Backends with modes of their own (such as
// postgres.RunOnceTx) use it to replay what they find.
func (s *Store[R]) Decode(rec Record) (R, error) { return s.decode(rec) }

// Encode fills the outcome fields of a completed record (Value, Failed,
// ErrMsg) from fn's result and final error, with the store's Codec.
func (s *Store[R]) Encode(rec *Record, val R, err error) error {
	rec.Failed, rec.ErrMsg = err != nil, ""
	if err != nil {
		rec.ErrMsg = err.Error()
	}
	var merr error
	rec.Value, merr = s.opts.Codec.Marshal(val)
	return merr
}

// decode turns a completed record back into the outcome it recorded. A final
// error comes back with its message, and IsFinal recognises it.
func (s *Store[R]) decode(rec Record) (R, error) {
	var val R
	if len(rec.Value) > 0 {
		if err := s.opts.Codec.Unmarshal(rec.Value, &val); err != nil {
			return val, fmt.Errorf("idem: decoding recorded outcome: %w", err)
		}
	}
	if rec.Failed {
		return val, Final(errors.New(rec.ErrMsg))
	}
	return val, nil
}

// newToken returns a random ownership token for one claim.
func newToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported platforms
	return hex.EncodeToString(b[:])
}
