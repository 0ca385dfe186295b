// Package txrun holds what the transactional modes (the RunOnceTx of
// bolt, sqlite, postgres and mysql) share around their backend's transaction: the claim in
// memory, the caller waiting under its own ctx as RunOnce's callers do,
// the answer for a key whose record stands, and what a failed commit
// returns.
package txrun

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sync/atomic"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/internal/seam"
)

// Local is what a transactional mode needs of an idem.Store beyond its
// users' API; package idem provides it through internal/seam.
type Local[R any] interface {
	// BeginLocal is Begin for a caller that keeps key's durable record
	// itself, in its own transaction: it claims key in the store's memory
	// only, so that duplicates in this process wait for Finish, and
	// neither it nor Finish writes to the Backend.
	BeginLocal(ctx context.Context, key string, payload any) (*idem.Ticket[R], error)
	// FinishReplayed finishes a ticket from BeginLocal whose caller found
	// the outcome already recorded in its transaction: the waiters get
	// it, and the Observer counts a replay, not an execution.
	FinishReplayed(t *idem.Ticket[R], val R, err error) (R, error)
	// Encode fills a completed record's outcome fields (State, Value,
	// Failed, ErrMsg) with the store's Codec.
	Encode(rec *backend.Record, val R, err error) error
	// Decode returns the outcome a completed record holds; a final error
	// comes back with its message, and idem.IsFinal recognises it.
	Decode(rec backend.Record) (R, error)
	// Options returns the options the store runs with, defaults applied.
	Options() idem.Options
	// Get reads key's record from the store's Backend through the
	// store's guard for foreign code; a store without a Backend has none.
	Get(ctx context.Context, key string) (backend.Record, bool, error)
}

// Of returns store's transactional view. store must not be nil.
func Of[R any](store *idem.Store[R]) Local[R] {
	return seam.Local(store).(Local[R])
}

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
// claims key in this process (Local.BeginLocal), answers a replay,
// and runs tx, which gets the payload's fingerprint and returns the
// outcome and whether it found that outcome already recorded (a replay,
// not an execution). The caller waits under its own ctx (Do).
func Run[R any](ctx context.Context, store *idem.Store[R], key string, payload any, tx func(ctx context.Context, fp idem.Fingerprint) (R, error, bool)) (R, error) {
	var zero R
	note, _ := ctx.Value(replayNoteKey{}).(*replayNote)
	if note != nil {
		// Not for the calls tx's work makes: theirs are not this call's answer.
		ctx = context.WithValue(ctx, replayNoteKey{}, (*replayNote)(nil))
	}
	bound, _ := ctx.Value(boundKey{}).(*keyedBound)
	if bound != nil { // nor the bound (WithBound)
		ctx = context.WithValue(ctx, boundKey{}, (*keyedBound)(nil))
	}
	l := Of(store)
	t, err := l.BeginLocal(ctx, key, payload)
	if err != nil {
		return zero, err
	}
	if t.Replayed() { // another call's outcome, this process's: a replay
		note.replay(key)
		return t.Result()
	}
	if bound != nil && bound.key == key && !bound.b.Start() {
		t.Release() // the wait ended first: nothing ran, nothing is kept
		return zero, ErrGaveUp
	}
	fp, err := l.Options().Fingerprint(payload)
	if err != nil {
		t.Release()
		return zero, err
	}
	return Do(ctx, t, func(ctx context.Context) (R, error) {
		val, err, replayed := tx(ctx, fp)
		if replayed { // recorded by another process or store: a replay
			note.replay(key)
			return l.FinishReplayed(t, val, err)
		}
		return val, err
	})
}

// A replayNote is where Run tells the caller that put it in ctx
// (NoteReplays) that its answer for key was a replay: an outcome recorded
// before, not fn's.
type replayNote struct {
	key      string
	replayed atomic.Bool // set by Run, maybe on the work's goroutine
}

type replayNoteKey struct{}

func (n *replayNote) replay(key string) {
	if n != nil && n.key == key {
		n.replayed.Store(true)
	}
}

// NoteReplays returns ctx carrying a note for key, and a function that
// reports whether a Run under ctx for key answered with an outcome
// recorded before (a replay) rather than by running its work. A Run for
// another key, or one nested in the work of a Run, leaves the note alone.
// It is how a caller that hands ctx to a user's RunOnceTx (a queue
// consumer's HandleTx) learns what RunOnceTx's result does not say.
func NoteReplays(ctx context.Context, key string) (context.Context, func() bool) {
	n := &replayNote{key: key}
	return context.WithValue(ctx, replayNoteKey{}, n), n.replayed.Load
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
		val, err := Of(store).Decode(rec)
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
