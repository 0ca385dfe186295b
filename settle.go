package idem

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/seed094d4201/idem/backend"
)

// Writes whose outcome is unknown (an error, a lost reply, a dropped
// connection) are settled by the claim's token: the store tries again, with
// a backoff between these bounds, and reads the record back to learn
// whether an earlier try landed. Client libraries open a fresh connection
// for a try after a broken one.
const (
	settleMin = 10 * time.Millisecond
	settleMax = time.Second
)

// complete records done, a completed record under its claim's token, and
// returns nil once it is recorded. A try that fails is read back: the
// record completed under this token means an earlier try landed, another
// token or no record means the claim was lost (ErrNotOwner), and the claim
// still pending means no try landed yet, so it tries again until
// Options.SettleTimeout runs out. Every try expires the outcome TTL after
// at, when it was known.
func (s *Store[R]) complete(ctx context.Context, done backend.Record, at time.Time) error {
	b := s.b
	return s.settle(ctx, func(ctx context.Context) error {
		return b.Complete(ctx, done, at, s.opts.TTL)
	}, func(rec backend.Record, found bool) (bool, error) {
		switch {
		case !found || rec.Token != done.Token:
			return true, backend.ErrNotOwner
		case rec.State == backend.StateCompleted && holdsOutcome(rec, done):
			return true, nil // an earlier try landed
		case rec.State == backend.StateCompleted:
			// Completed under this token with another outcome: the claim's
			// owner and an operator's Resolve share the token, so this is
			// the other's write, not ours.
			return true, backend.ErrNotOwner
		}
		return false, nil
	}, done.Key)
}

// holdsOutcome reports whether read, a completed record read back, holds
// done's outcome: its message as written, or as a backend that cannot
// store every byte of it stores it (backend.StorableText).
func holdsOutcome(read, done backend.Record) bool {
	return read.Failed == done.Failed && bytes.Equal(read.Value, done.Value) &&
		(read.ErrMsg == done.ErrMsg || read.ErrMsg == backend.StorableText(done.ErrMsg))
}

// release deletes the claim held by token, settling a failed try as
// complete does: no record, or another token's, means it is released.
func (s *Store[R]) release(ctx context.Context, key, token string) error {
	b := s.b
	return s.settle(ctx, func(ctx context.Context) error {
		return b.Release(ctx, key, token)
	}, func(rec backend.Record, found bool) (bool, error) {
		switch {
		case !found || rec.Token != token:
			return true, nil
		case rec.State == backend.StateCompleted:
			return true, backend.ErrNotOwner
		}
		return false, nil
	}, key)
}

// settle runs write until it succeeds or check, given the key's record as
// read back after a failed try, says the write is settled (with the error
// it returns). When Options.SettleTimeout runs out it returns the last
// error, but never as ErrNotOwner: a repeat that finds its own earlier
// try landed answers that too (the Backend contract), so only the record
// read back tells a lost claim. The callers pass a context without
// cancellation, so only that timeout ends the whole.
func (s *Store[R]) settle(ctx context.Context, write func(context.Context) error, check func(backend.Record, bool) (bool, error), key string) error {
	ctx, cancel := context.WithTimeout(ctx, s.opts.SettleTimeout)
	defer cancel()
	wait := settleMin
	for {
		err := write(ctx)
		if err == nil {
			return nil
		}
		if refused(err) {
			return err
		}
		rec, found, gerr := s.b.Get(ctx, key, s.opts.Now())
		if gerr == nil {
			if ok, cerr := check(rec, found); ok {
				return cerr
			}
		}
		if !pause(ctx.Done(), wait) {
			if errors.Is(err, backend.ErrNotOwner) {
				return fmt.Errorf("%w: the write answered %q, and the record could not be read back to tell whether an earlier try landed", errUnsettled, err)
			}
			return err
		}
		wait = min(2*wait, settleMax)
	}
}

// errUnsettled is why a write's fate is unknown when it answered
// ErrNotOwner and its record could not be read back.
var errUnsettled = errors.New("idem: the write's fate is unknown")

// pause waits for d and reports true, or reports false at once if done is
// closed first.
func pause(done <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return false
	case <-t.C:
		return true
	}
}

// releaseOrLater releases the claim held by token, and if that cannot be
// settled now, goes on trying in the background: a failure before commit
// must leave the key free once the backend answers, not pinned to this
// process's memory nor interrupted for good. It returns the error of the
// first attempt.
//
// A Backend that ends the goroutine (runtime.Goexit) leaves the release's
// fate unknown too: it goes on in the background as the goroutine ends.
func (s *Store[R]) releaseOrLater(ctx context.Context, key, token string) error {
	returned := false
	defer exiting(&returned, func() { s.releaseLater(key, token) })
	err := s.release(ctx, key, token)
	returned = true
	if err != nil && !errors.Is(err, backend.ErrNotOwner) {
		s.releaseLater(key, token)
	}
	return err
}

// completeLater goes on recording done, an outcome the backend could not
// take, in the background: memory replays it meanwhile (e, pinned), and
// the claim's lease l is renewed until it is recorded. Once the backend has it,
// or holds another owner's record instead (an operator reconciled the
// key), the pin ends and later calls read the backend; only e's pin, never
// a later execution's entry for the key. It gives up when the store
// closes; after a restart the key is interrupted.
func (s *Store[R]) completeLater(done backend.Record, at time.Time, e *entry[R], l *lease[R]) {
	s.recording.Add(1)
	s.startBackground(func() { s.recordLater(done, at, e, l, false) })
}

// recordLater is completeLater's goroutine. A Backend that ends it
// (runtime.Goexit) does not end the recording: it goes on from a fresh
// goroutine, after a pause (again), so that the pin and the lease are
// not left for ever.
func (s *Store[R]) recordLater(done backend.Record, at time.Time, e *entry[R], l *lease[R], again bool) {
	returned := false
	defer exiting(&returned, func() {
		s.startBackground(func() { s.recordLater(done, at, e, l, true) })
	})
	defer func() {
		if returned {
			s.recording.Add(-1)
			select {
			case s.recorded <- struct{}{}:
			default:
			}
			l.stop()
		}
	}()
	if again && !pause(s.closing.Done(), settleMax) {
		returned = true
		return
	}
	for wait := settleMin; ; wait = min(2*wait, settleMax) {
		ctx, cancel := context.WithTimeout(s.closing, s.opts.SettleTimeout)
		err := s.complete(ctx, done, at)
		cancel()
		if err == nil || errors.Is(err, backend.ErrNotOwner) {
			// Its execution may have yet to pin it.
			for !s.table.unpin(e) && pause(s.closing.Done(), settleMin) {
			}
			returned = true
			return
		}
		if !pause(s.closing.Done(), wait) {
			returned = true
			return
		}
	}
}

// awaitRecording waits until no held outcome is still being written to
// the Backend, or until grace ends; it returns how many it gave up on.
func (s *Store[R]) awaitRecording(grace <-chan struct{}) int64 {
	for {
		n := s.recording.Load()
		if n == 0 {
			return 0
		}
		select {
		case <-s.recorded:
		case <-grace:
			return s.recording.Load()
		}
	}
}

// holdLease keeps a claim's lease renewed until the store closes, for an
// outcome that memory holds and no write can record (it could not be
// encoded): while this process lives, no other store may take the key for
// interrupted and run it again.
func (s *Store[R]) holdLease(l *lease[R]) {
	s.unwritable.Add(1)
	s.startBackground(func() {
		<-s.closing.Done()
		l.stop()
	})
}

// refused reports whether err is a Backend's refusal of a call it did not
// carry out: there is nothing to read back, and trying again is no use.
func refused(err error) bool {
	return errors.Is(err, ErrClosed) || errors.Is(err, backend.ErrRefused)
}
