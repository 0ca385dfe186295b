package idem

import (
	"context"
	"errors"
	"sync"
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
// error. The callers pass a context without cancellation, so only that
// timeout ends the whole.
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
		s.releaseLater(key, token)
	}
	return err
}

// completeLater goes on recording done, an outcome the backend could not
// take, in the background: memory replays it meanwhile (pinned). Once the
// backend has it, or holds another owner's record instead (an operator
// reconciled the key), the pin ends and later calls read the backend. It
// gives up when the store closes; after a restart the key is interrupted.
func (s *Store[R]) completeLater(done Record) {
	s.startBackground(func() {
		wait := settleMin
		for {
			select {
			case <-s.closing.Done():
				return
			case <-time.After(wait):
			}
			wait = min(2*wait, settleMax)
			ctx, cancel := context.WithTimeout(s.closing, s.settleTimeout())
			err := s.complete(ctx, done)
			cancel()
			if err == nil || errors.Is(err, ErrNotOwner) {
				for !s.table.unpin(done.Key) { // its execution has yet to pin it
					select {
					case <-s.closing.Done():
						return
					case <-time.After(settleMin):
					}
				}
				return
			}
		}
	})
}

// releaseLater releases, in the background, a claim whose fate is unknown:
// it may have landed, or may yet land (a request delayed on a connection
// given up on), and it must not hold its key until its lease lapses and
// leaves it interrupted. The claim is released once the backend answers,
// and watched for a lease and a settle timeout from now, in case it shows
// up late.
func (s *Store[R]) releaseLater(key, token string) {
	s.releases.add(s, key, token, time.Now().Add(s.opts.Lease+s.settleTimeout()))
}

// A releaser releases claims of unknown fate from one goroutine of the
// store's, which runs while it has any: however many claims fail during an
// outage, the store holds one goroutine for them and, once the backend is
// back, sends it their releases one at a time.
type releaser struct {
	mu      sync.Mutex
	pending map[unknownClaim]time.Time // guarded by mu: each claim and the end of its watch
	running bool                       // guarded by mu: the goroutine runs
	idle    chan struct{}              // guarded by mu: closed when the goroutine exits
}

type unknownClaim struct{ key, token string }

func (r *releaser) add(s releaseRunner, key, token string, watch time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.pending == nil {
		r.pending = make(map[unknownClaim]time.Time)
	}
	r.pending[unknownClaim{key, token}] = watch
	if !r.running {
		r.running, r.idle = true, make(chan struct{})
		s.startBackground(func() { r.run(s) })
	}
}

// done returns a channel closed once no release is pending (nil if none is).
func (r *releaser) done() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.running {
		return nil
	}
	return r.idle
}

// releaseRunner is what a releaser needs of its Store.
type releaseRunner interface {
	startBackground(func())
	tryRelease(key, token string) error
	closingDone() <-chan struct{}
}

// run tries every pending release, in rounds with a backoff between them,
// until none is left or the store has closed.
func (r *releaser) run(s releaseRunner) {
	wait := settleMin
	for {
		r.mu.Lock()
		claims := make([]unknownClaim, 0, len(r.pending))
		for c := range r.pending {
			claims = append(claims, c)
		}
		r.mu.Unlock()
		for _, c := range claims {
			err := s.tryRelease(c.key, c.token)
			r.mu.Lock()
			switch {
			case err == nil, errors.Is(err, ErrClosed):
				delete(r.pending, c)
			case errors.Is(err, ErrNotOwner) && time.Now().After(r.pending[c]):
				delete(r.pending, c) // it never landed, or was settled otherwise
			}
			r.mu.Unlock()
		}
		r.mu.Lock()
		if len(r.pending) == 0 {
			r.running = false
			close(r.idle)
			r.mu.Unlock()
			return
		}
		r.mu.Unlock()
		select {
		case <-s.closingDone():
			r.mu.Lock()
			r.running = false
			close(r.idle)
			r.mu.Unlock()
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, settleMax)
	}
}

func (s *Store[R]) startBackground(fn func()) {
	s.background.Add(1)
	go func() {
		defer s.background.Done()
		fn()
	}()
}

// tryRelease makes one attempt at a release, bounded so that one call that
// hangs cannot hold the others up for long.
func (s *Store[R]) tryRelease(key, token string) error {
	ctx, cancel := context.WithTimeout(s.closing, settleMax)
	defer cancel()
	return s.opts.Backend.Release(ctx, key, token)
}

func (s *Store[R]) closingDone() <-chan struct{} { return s.closing.Done() }
