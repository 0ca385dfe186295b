package idem

import (
	"errors"
	"runtime/debug"
	"time"
)

// errStopped ends a sweep early when the store is closing.
var errStopped = errors.New("idem: sweeper stopped")

// sweepLoop removes expired outcomes every interval until Close. It is
// supervised: a panic inside one sweep is recovered and logged, and the next
// tick sweeps again.
//
// A sweep that ends the goroutine (runtime.Goexit in the Observer's Sweep,
// as t.FailNow does) cannot be recovered: the loop starts again on a new
// goroutine, so that expired outcomes are still swept.
func (s *Store[R]) sweepLoop(interval time.Duration) {
	ticker := time.NewTicker(interval)
	stopped := false
	defer func() {
		ticker.Stop()
		if stopped {
			close(s.swept)
			return
		}
		go s.sweepLoop(interval)
	}()
	for {
		select {
		case <-s.stop:
			stopped = true
			return
		case <-ticker.C:
			s.sweepOnce()
		}
	}
}

// sweepOnce runs one supervised sweep.
func (s *Store[R]) sweepOnce() {
	returned := false
	defer guard(&returned, func(v any) {
		s.opts.Logger.Error("idem: sweep panicked; sweeping goes on at the next interval",
			"panic", v, "stack", string(debug.Stack()))
	}, nil)
	// s.stopping ends a backend sweep that blocks, so it cannot hold Close up.
	_, err := s.sweep(s.stopping, s.stopped)
	returned = true
	if err != nil && err != errStopped && s.stopping.Err() == nil {
		s.opts.Logger.Error("idem: sweep failed; sweeping goes on at the next interval", "err", err)
	}
}

// stopped returns errStopped once Close has begun, so a long sweep does not
// hold Close up.
func (s *Store[R]) stopped() error {
	select {
	case <-s.stop:
		return errStopped
	default:
		return nil
	}
}
