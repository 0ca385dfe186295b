package idem

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
)

// executeDurable claims key in the Backend and runs fn, or answers from the
// record it finds there. It runs once per key per process at a time: the
// memory table has already made this caller the key's only owner here. pin
// reports an outcome that the backend could not settle (record or release),
// so that its record stays pending: memory must hold the outcome for as long
// as the store lives, or this process would find the key pending forever.
func (s *Store[R]) executeDurable(ctx context.Context, key string, fp Fingerprint, fn func(context.Context) (R, error)) (val R, err error, pin bool) {
	b := s.opts.Backend
	for retried := false; ; retried = true {
		now := s.opts.Now()
		claim := Record{Key: key, Fingerprint: fp, Token: newToken(), State: StatePending, CreatedAt: now}
		rec, claimed, err := b.Claim(ctx, claim, now)
		switch {
		case err != nil:
			return val, &BackendError{Op: "claim", Err: err}, false
		case claimed:
			return s.runClaimed(ctx, claim, fn)
		case rec.Fingerprint != fp:
			return val, ErrPayloadMismatch, false
		case rec.State == StateCompleted:
			val, err = s.decode(rec)
			return val, err, false
		case rec.State == StatePending:
			return val, fmt.Errorf("%w: claimed through another store", ErrInProgress), false
		case !s.opts.RetryInterrupted || retried:
			return val, ErrOutcomeUnknown, false
		}
		// RetryInterrupted: treat the interrupted claim as failed before
		// commit. Its token is compared, so if another store took it over in
		// the meantime this release fails and the claim below finds theirs.
		if err := b.Release(ctx, key, rec.Token); err != nil && !errors.Is(err, ErrNotOwner) {
			return val, fmt.Errorf("idem: releasing interrupted key in backend: %w", err), false
		}
	}
}

// runClaimed runs fn under the durable claim and records its outcome: a final
// outcome is completed, anything else releases the claim. Both use a context
// that fn's timeout cannot end, so a finished operation is never lost for
// want of time to record it.
func (s *Store[R]) runClaimed(ctx context.Context, claim Record, fn func(context.Context) (R, error)) (val R, err error, pin bool) {
	b := s.opts.Backend
	record := context.WithoutCancel(ctx)
	settled := false
	defer func() {
		if !settled { // fn called runtime.Goexit: it failed before commit
			_ = b.Release(record, claim.Key, claim.Token)
		}
	}()
	val, err, returned := call(ctx, fn)
	settled = true
	if !returned || !isFinalOutcome(err) {
		if rerr := b.Release(record, claim.Key, claim.Token); rerr != nil {
			// The record stays pending: pin the failure so this process
			// answers it rather than "in progress" until a restart makes
			// the key interrupted.
			return val, errors.Join(err, fmt.Errorf("idem: releasing key in backend: %w", rerr)), true
		}
		return val, err, false
	}

	done := claim
	done.State, done.ExpiresAt = StateCompleted, s.opts.Now().Add(s.opts.TTL)
	if err != nil {
		done.Failed, done.ErrMsg = true, err.Error()
	}
	var rerr error
	if done.Value, rerr = s.opts.Codec.Marshal(val); rerr == nil {
		rerr = b.Complete(record, done)
	}
	if rerr != nil {
		// Never release a key after fn succeeded: it stays claimed (durably
		// pending, interrupted after a restart) and memory replays it for as
		// long as the store lives.
		return val, errors.Join(err, &NotRecordedError{Err: rerr}), true
	}
	return val, err, false
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
