package idem

import (
	"context"
	"fmt"
	"strings"
)

// Close stops the sweeper, refuses later calls with ErrClosed, and waits for
// executions in flight and open tickets to finish, be recorded and be told
// to the Observer; Options.ExecutionTimeout bounds that wait for an fn that
// honours its context, and Shutdown bounds it by a context. Claims whose
// fate the store could not learn (a lost reply while the backend was
// failing) then get up to Options.SettleTimeout more to be released, and
// outcomes the Backend had not taken yet (memory holds them) as long to be
// recorded, so that they do not leave their keys interrupted; one still
// unknown or unrecorded after that is left to its lease, and Shutdown
// says so. Close does not close Options.Backend, which the caller opened.
// Callers waiting on those executions still get their outcomes. Close is
// idempotent: later calls return nil once the first has finished. Calling
// Close from inside fn deadlocks, since Close waits for fn.
func (s *Store[R]) Close() error {
	s.startClose()
	<-s.closeDone
	return nil
}

// Shutdown closes the store as Close does, but waits only until ctx ends,
// as http.Server.Shutdown does. It refuses new calls at once. If ctx ends
// before every execution and open ticket has finished, Shutdown returns an
// error that matches ctx.Err() and says what it left: the keys still in
// flight, which go on and are recorded as they finish (a later Close waits
// for them), the outcomes still held for a Backend that has not taken
// them, and whether releases of claims of unknown fate are still being
// tried (for up to Options.SettleTimeout). A store with none of those
// left returns nil, even for a ctx that has ended.
func (s *Store[R]) Shutdown(ctx context.Context) error {
	if ctx == nil {
		return errNilContext
	}
	s.startClose()
	select {
	case <-s.closeDone:
		return s.gaveUp()
	case <-ctx.Done():
	}
	select {
	case <-s.closeDone: // finished at the same moment
		return s.gaveUp()
	default:
	}
	inFlight, pinned := s.table.held()
	releasing := s.releases.done() != nil
	telling := s.telling.Load()
	if inFlight == 0 && pinned == 0 && !releasing && telling == 0 {
		// Idle: what is left ends at once, as for http.Server, unless
		// the sweeper is inside a Backend.Sweep or an Observer.Sweep
		// that has not returned: that is not waited for past ctx.
		if s.swept != nil {
			select {
			case <-s.swept:
			case <-s.closeDone:
			default:
				return fmt.Errorf("idem: shutdown: %w; left the sweeper running (a Backend.Sweep or Observer.Sweep that has not returned)", ctx.Err())
			}
		}
		<-s.closeDone
		return s.gaveUp()
	}
	return fmt.Errorf("idem: shutdown: %w; left keys in flight: %d, outcomes not yet recorded: %d, releases of unknown fate pending: %v, executions whose end the Observer is still being told: %d",
		ctx.Err(), inFlight, pinned, releasing, telling)
}

// gaveUp is Shutdown's error for what closing left undone in the Backend,
// or nil: outcomes it gave up recording, outcomes it could never record
// (the Codec could not encode them), and claims of failed or unstarted work
// it gave up releasing. Each leaves its key to be read as interrupted once
// its lease lapses.
func (s *Store[R]) gaveUp() error {
	var left []string
	if n := s.abandoned.Load(); n > 0 {
		left = append(left, fmt.Sprintf("%d outcomes were not recorded in the Backend within the settle timeout", n))
	}
	if n := s.unwritable.Load(); n > 0 {
		left = append(left, fmt.Sprintf("%d outcomes held in memory could not be written at all (the Codec could not encode them, or the code writing them ended its goroutine)", n))
	}
	if n := s.unreleased; n > 0 {
		left = append(left, fmt.Sprintf("%d claims of failed or unstarted work were not released within the settle timeout", n))
	}
	if len(left) == 0 {
		return nil
	}
	return fmt.Errorf("idem: shutdown: %s; their keys read as interrupted once their leases lapse", strings.Join(left, ", and "))
}

// startClose starts closing the store, once, on a goroutine of its own;
// closeDone is closed when it has finished.
func (s *Store[R]) startClose() {
	s.closeOnce.Do(func() {
		s.closed.Store(true)
		s.table.close()
		close(s.stop)
		s.endStopping()
		go func() {
			defer close(s.closeDone)
			s.closeWait()
		}()
	})
}

// closeWait waits for what Close waits for, the store already closed to
// new calls.
func (s *Store[R]) closeWait() {
	if s.swept != nil {
		<-s.swept
	}
	s.table.running.Wait()
	// Claims of unknown fate get a settle timeout to be released, and
	// outcomes held for a Backend that had not taken them the same to be
	// recorded, so that closing a store during a backend blip strands no
	// key (an outcome given up leaves its key interrupted, and with
	// RetryInterrupted it would run again).
	// One deadline for both waits: a channel that stays closed once it
	// ends, where a timer's fires once, so the second wait sees it too.
	grace, cancel := context.WithTimeout(context.Background(), s.opts.SettleTimeout)
	defer cancel()
	if idle := s.releases.done(); idle != nil {
		select {
		case <-idle:
		case <-grace.Done():
		}
	}
	s.abandoned.Store(s.awaitRecording(grace.Done()))
	s.endClosing()
	s.background.Wait()
	s.unreleased = s.releases.left()
}
