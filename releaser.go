package idem

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/seed094d4201/idem/backend"
)

// releaseLater releases, in the background, a claim whose fate is unknown:
// it may have landed, or may yet land (a request delayed on a connection
// given up on), and it must not hold its key until its lease lapses and
// leaves it interrupted. The claim is released once the backend answers,
// and watched for a lease and a settle timeout from now, in case it shows
// up late.
func (s *Store[R]) releaseLater(key, token string) {
	s.releases.add(s, key, token, time.Now().Add(s.opts.Lease+s.opts.SettleTimeout))
}

// A releaser releases claims of unknown fate from one goroutine of the
// store's, which runs while it has any: however many claims fail during an
// outage, the store holds one goroutine for them and, once the backend is
// back, sends it their releases one at a time.
type releaser struct {
	mu      sync.Mutex
	pending map[unknownClaim]time.Time // guarded by mu: each claim and the end of its watch
	idle    chan struct{}              // guarded by mu: non-nil while the goroutine runs, closed as it exits
}

type unknownClaim struct{ key, token string }

// releaseRunner is what a releaser needs of its Store, which is generic
// where the releaser is not.
type releaseRunner interface {
	startBackground(func())
	tryRelease(key, token string) error
	closingDone() <-chan struct{}
}

func (r *releaser) add(s releaseRunner, key, token string, watch time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.pending == nil {
		r.pending = make(map[unknownClaim]time.Time)
	}
	r.pending[unknownClaim{key, token}] = watch
	if r.idle == nil {
		r.idle = make(chan struct{})
		s.startBackground(func() { r.run(s, false) })
	}
}

// left returns how many claims are still to be released: once the
// releaser has exited on closing, those closing gave up on.
func (r *releaser) left() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.pending)
}

// done returns a channel closed once no release is pending (nil if none is).
func (r *releaser) done() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.idle
}

// run tries every pending release, in rounds with a backoff between them,
// until none is left or the store has closed. A Backend whose Release
// ends the goroutine (runtime.Goexit) does not end the releases: they go
// on from a fresh goroutine, after a pause (again).
func (r *releaser) run(s releaseRunner, again bool) {
	returned := false
	defer exiting(&returned, func() { s.startBackground(func() { r.run(s, true) }) })
	if again && !pause(s.closingDone(), settleMax) {
		r.exit(true)
		returned = true
		return
	}
	r.rounds(s)
	returned = true
}

// rounds is run's loop.
func (r *releaser) rounds(s releaseRunner) {
	for wait := settleMin; ; wait = min(2*wait, settleMax) {
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
			case err == nil, refused(err) && !ended(s.closingDone()):
				// A refusal once closing has ended the releases' context
				// wrote nothing: the claim stays, and closing gave it up.
				delete(r.pending, c)
			case errors.Is(err, backend.ErrNotOwner) && time.Now().After(r.pending[c]):
				delete(r.pending, c) // it never landed, or was settled otherwise
			}
			r.mu.Unlock()
		}
		if r.exit(false) {
			return
		}
		if !pause(s.closingDone(), wait) {
			r.exit(true)
			return
		}
	}
}

// exit ends the goroutine if nothing is pending, or anyway if closing: both
// under mu, so that add either sees it running or starts another.
func (r *releaser) exit(closing bool) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !closing && len(r.pending) > 0 {
		return false
	}
	close(r.idle)
	r.idle = nil
	return true
}

// ended reports whether done is closed.
func ended(done <-chan struct{}) bool {
	select {
	case <-done:
		return true
	default:
		return false
	}
}

// startBackground runs fn on a goroutine that Close waits for.
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
	return s.b.Release(ctx, key, token)
}

func (s *Store[R]) closingDone() <-chan struct{} { return s.closing.Done() }
