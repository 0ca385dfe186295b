package idem

import (
	"context"
	"errors"
	"time"
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

// settleTimeout is how long the store keeps trying to settle one write.
func (s *Store[R]) settleTimeout() time.Duration { return s.opts.SettleTimeout }

// complete records done, a completed record under its claim's token, and
// returns nil once it is recorded. A try that fails is read back: the
// record completed under this token means an earlier try landed, another
// token or no record means the claim was lost (ErrNotOwner), and the claim
// still pending means no try landed yet, so it tries again until
// Options.SettleTimeout runs out.
func (s *Store[R]) complete(ctx context.Context, done Record) error {
	b := s.opts.Backend
	return s.settle(ctx, func(ctx context.Context) error {
		return b.Complete(ctx, done, s.opts.Now(), s.opts.TTL)
	}, func(rec Record, found bool) (bool, error) {
		switch {
		case !found || rec.Token != done.Token:
			return true, ErrNotOwner
		case rec.State == StateCompleted:
			return true, nil
		}
		return false, nil
	}, done.Key)
}

// release deletes the claim held by token, settling a failed try as
// complete does: no record, or another token's, means it is released.
func (s *Store[R]) release(ctx context.Context, key, token string) error {
	b := s.opts.Backend
	return s.settle(ctx, func(ctx context.Context) error {
		return b.Release(ctx, key, token)
	}, func(rec Record, found bool) (bool, error) {
		switch {
		case !found || rec.Token != token:
			return true, nil
		case rec.State == StateCompleted:
			return true, ErrNotOwner
		}
		return false, nil
	}, key)
}

// settle runs write until it succeeds or check, given the key's record as
// read back after a failed try, says the write is settled (with the error
// it returns). When Options.SettleTimeout runs out it returns the last
// error. ctx bounds each call but not the whole, which ctx never ends
// sooner than the timeout: the callers pass a context without cancellation.
func (s *Store[R]) settle(ctx context.Context, write func(context.Context) error, check func(Record, bool) (bool, error), key string) error {
	ctx, cancel := context.WithTimeout(ctx, s.settleTimeout())
	defer cancel()
	wait := settleMin
	for {
		err := write(ctx)
		if err == nil {
			return nil
		}
		if errors.Is(err, ErrClosed) {
			return err
		}
		rec, found, gerr := s.opts.Backend.Get(ctx, key, s.opts.Now())
		if gerr == nil {
			if ok, cerr := check(rec, found); ok {
				return cerr
			}
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
		wait = min(2*wait, settleMax)
	}
}

// releaseOrLater releases the claim held by token, and if that cannot be
// settled now, goes on trying in the background: a failure before commit
// must leave the key free once the backend answers, not pinned to this
// process's memory nor interrupted for good. It returns the error of the
// first attempt.
func (s *Store[R]) releaseOrLater(ctx context.Context, key, token string) error {
	err := s.release(ctx, key, token)
	if err != nil && !errors.Is(err, ErrNotOwner) {
		s.releaseLater(key, token, time.Now())
	}
	return err
}

// releaseLater releases, in the background, a claim whose fate is unknown:
// it may have landed, or may yet land (a request delayed on a connection
// given up on), and it must not hold its key until its lease lapses and
// leaves it interrupted. It releases the claim once the backend answers,
// and watches for it to show up for a lease and a settle timeout after
// sent. It gives up when the store closes.
func (s *Store[R]) releaseLater(key, token string, sent time.Time) {
	watch := sent.Add(s.opts.Lease + s.settleTimeout())
	s.background.Add(1)
	go func() {
		defer s.background.Done()
		ctx := s.closing
		wait := settleMin
		for {
			err := s.opts.Backend.Release(ctx, key, token)
			switch {
			case err == nil, errors.Is(err, ErrClosed):
				return
			case errors.Is(err, ErrNotOwner) && time.Now().After(watch):
				return // it never landed, or it was settled otherwise
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
			wait = min(2*wait, settleMax)
		}
	}()
}
