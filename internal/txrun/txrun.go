// Package txrun holds what the transactional modes (postgres, sqlite and
// bolt RunOnceTx) share around their backend's transaction: the claim in
// memory, the caller waiting under its own ctx as RunOnce's callers do,
// the answer for a key whose record stands, and what a failed commit
// returns.
package txrun

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
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
		// Deferred, so that the caller hears even of a work that ended its
		// goroutine (runtime.Goexit): Finish on a finished ticket returns
		// the outcome it was settled with.
		defer func() {
			t.Release()
			var zero R
			val, err := t.Finish(zero, nil)
			done <- outcome{val, err}
		}()
		t.Do(work)
	}()
	select {
	case o := <-done:
		return o.val, o.err
	case <-ctx.Done():
		var zero R
		return zero, fmt.Errorf("%w: %w", idem.ErrInProgress, ctx.Err())
	}
}

// Unrecorded is the error of a transactional call whose outcome could not
// be committed, so that nothing was: neither the key nor fn's writes. It
// wraps cause and names what fn returned, but is never final, whatever fn
// returned: the key is free, and the next call runs fn again.
func Unrecorded(fnErr, cause error) error {
	if fnErr == nil {
		return cause
	}
	return fmt.Errorf("%w (fn's final error %q was not recorded: nothing was committed)", cause, fnErr.Error())
}

// Run is what every RunOnceTx does around its backend's transaction: it
// claims key in this process (idem.Store.BeginLocal), answers a replay,
// and runs tx, which gets the payload's fingerprint and returns the
// outcome and whether it found that outcome already recorded (a replay,
// not an execution). The caller waits under its own ctx (Do).
func Run[R any](ctx context.Context, store *idem.Store[R], key string, payload any, tx func(ctx context.Context, fp idem.Fingerprint) (R, error, bool)) (R, error) {
	var zero R
	t, err := store.BeginLocal(ctx, key, payload)
	if err != nil {
		return zero, err
	}
	if t.Replayed() {
		return t.Result()
	}
	fp, err := store.Options().Fingerprint(payload)
	if err != nil {
		t.Release()
		return zero, err
	}
	return Do(ctx, t, func(ctx context.Context) (R, error) {
		val, err, replayed := tx(ctx, fp)
		if replayed { // recorded by another process or store: a replay
			return t.FinishReplayed(val, err)
		}
		return val, err
	})
}

// Answer is what a RunOnceTx returns for a key whose record stands, rec
// as the backend's clock sees it: a replay of a recorded outcome, or why
// the key cannot run.
func Answer[R any](store *idem.Store[R], rec backend.Record, fp idem.Fingerprint) (_ R, _ error, replayed bool) {
	var zero R
	switch {
	case rec.Fingerprint != fp:
		return zero, idem.ErrPayloadMismatch, false
	case rec.State == backend.StateCompleted:
		val, err := store.Decode(rec)
		return val, err, true
	case rec.State == backend.StatePending:
		return zero, idem.ErrHeldOutsideTx, false
	}
	return zero, idem.ErrOutcomeUnknown, false
}

// Token returns a token unique to one transaction's claim.
func Token() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported platforms
	return "tx-" + hex.EncodeToString(b[:])
}
