package idem_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// watchGets wraps b and reports on seen (if it is not full) each Get made
// after the instant after holds, once it is set.
func watchGets(b backend.Backend, after *atomic.Pointer[time.Time], seen chan<- struct{}) idemtest.Faulty {
	return idemtest.Faulty{Backend: b, Lose: func(op string) error {
		if at := after.Load(); op == "Get" && at != nil && time.Now().After(*at) {
			select {
			case seen <- struct{}{}:
			default:
			}
		}
		return nil
	}}
}

// Two stores share a Backend and one clock, as two processes share a
// database. Store 0's owner runs fn, alive and within its lease on its
// own monotonic clock, while the clock steps forward past the lease: the
// record reads as lapsed. Store 1 must not take the key over (with
// RetryInterrupted or Resume) nor answer ErrOutcomeUnknown: the owner's
// renewal brings the lease back, and store 1 gets the owner's answer. The
// owner's fn ignores its context, as a charge already sent would.
func TestClockStepForwardDoesNotTakeALiveOwnersKey(t *testing.T) {
	for _, mode := range []string{"plain", "RetryInterrupted", "Resume"} {
		t.Run(mode, func(t *testing.T) {
			const lease = 300 * time.Millisecond
			clock := idemtest.NewClock(time.Now().UTC().Truncate(time.Second))
			mem := idemtest.NewMemoryBackend()
			var after atomic.Pointer[time.Time]
			seen := make(chan struct{}, 1)
			quiet := slog.New(slog.DiscardHandler)
			s0 := idem.New[string](idem.Options{Backend: mem, Now: clock.Now, Lease: lease, Logger: quiet})
			defer closeWithin(t, s0, 5*time.Second)
			o1 := idem.Options{Backend: watchGets(mem, &after, seen), Now: clock.Now, Lease: lease, Logger: quiet}
			switch mode {
			case "RetryInterrupted":
				o1.RetryInterrupted = true
			case "Resume":
				o1.Resume = true
			}
			s1 := idem.New[string](o1)
			defer closeWithin(t, s1, 5*time.Second)

			var runs atomic.Int64
			started, finish := make(chan struct{}), make(chan struct{})
			first := make(chan error, 1)
			go func() {
				v, err := s0.RunOnce(context.Background(), "k", "p", func(context.Context) (string, error) {
					runs.Add(1)
					close(started)
					<-finish // ignores its context
					return "first", nil
				})
				if err == nil && v != "first" {
					err = fmt.Errorf("store 0 got %q", v)
				}
				first <- err
			}()
			<-started
			clock.Advance(2 * time.Hour)

			// Let store 1 watch the key for three leases on its own clock
			// before the owner finishes.
			at := time.Now().Add(3 * lease)
			after.Store(&at)
			var once atomic.Bool
			release := func() {
				if once.CompareAndSwap(false, true) {
					close(finish)
				}
			}
			defer release()
			go func() {
				<-seen
				release()
			}()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			v, err := s1.RunOnce(ctx, "k", "p", func(context.Context) (string, error) {
				runs.Add(1)
				return "second", nil
			})
			release()
			require.NoError(t, err, "store 1 must wait for the live owner")
			assert.Equal(t, "first", v)
			require.NoError(t, <-first)
			assert.Equal(t, int64(1), runs.Load(), "fn ran twice for one key")
		})
	}
}

// The mirror case: the clock steps back by hours after an owner died with
// its key claimed. The record reads as pending under a lease that now ends
// hours ahead; a store with RetryInterrupted must not wait for it: a claim
// seen unrenewed for a whole lease on its own clock is its dead owner's.
func TestClockStepBackDoesNotHoldADeadOwnersKey(t *testing.T) {
	const lease = 200 * time.Millisecond
	clock := idemtest.NewClock(time.Now().UTC().Truncate(time.Second))
	mem := idemtest.NewMemoryBackend()
	// The dead owner's claim: made, never renewed, never settled.
	_, won, err := mem.Claim(context.Background(), backend.Record{Key: "k", Fingerprint: mustFingerprint(t, "p"), Token: "dead", State: backend.StatePending}, clock.Now(), lease)
	require.NoError(t, err)
	require.True(t, won)
	clock.Advance(-3 * time.Hour)

	s := idem.New[string](idem.Options{Backend: mem, Now: clock.Now, Lease: lease, RetryInterrupted: true, Logger: slog.New(slog.DiscardHandler)})
	defer closeWithin(t, s, 5*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	v, err := s.RunOnce(ctx, "k", "p", func(context.Context) (string, error) { return "again", nil })
	require.NoError(t, err)
	assert.Equal(t, "again", v)
	assert.Less(t, time.Since(start), 10*lease, "held for about a lease, not for the length of the step")
}

// An owner proven dead (bolt found its claim pending at Open: the owner
// held the file's lock) is taken over at once, with no watch.
func TestProvenDeadOwnerIsTakenOverAtOnce(t *testing.T) {
	const lease = time.Hour // a watch would outlast the test's ctx
	mem := idemtest.NewMemoryBackend()
	_, _, err := mem.Claim(context.Background(), backend.Record{Key: "k", Fingerprint: mustFingerprint(t, "p"), Token: "dead", State: backend.StatePending}, time.Now(), lease)
	require.NoError(t, err)
	mem.Crash()
	s := idem.New[string](idem.Options{Backend: mem, Lease: lease, RetryInterrupted: true, Logger: slog.New(slog.DiscardHandler)})
	defer closeWithin(t, s, 5*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	v, err := s.RunOnce(ctx, "k", "p", func(context.Context) (string, error) { return "again", nil })
	require.NoError(t, err)
	assert.Equal(t, "again", v)
}
