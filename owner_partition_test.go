package idem_test

import (
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An owner cut off from the backend (its renewals fail) still trusts its
// lease for the lease less a tenth from when its claim left: fn runs on.
// If the backend's clock then steps forward, the record reads as lapsed at
// once. Another store must not take the key over (RetryInterrupted,
// Resume) while the owner still trusts its claim: fn would run twice at
// once. The taker's fn checks that the owner's context has ended.
func TestPartitionedOwnerKeepsItsKeyThroughAClockStep(t *testing.T) {
	for _, mode := range []string{"RetryInterrupted", "Resume"} {
		t.Run(mode, func(t *testing.T) {
			const lease = time.Second
			clock := idemtest.NewClock(time.Now().UTC().Truncate(time.Second))
			mem := idemtest.NewMemoryBackend()
			quiet := slog.New(slog.DiscardHandler)
			cut := idemtest.Faulty{Backend: mem, Fail: func(op string) error {
				if op == "Renew" {
					return errors.New("partitioned")
				}
				return nil
			}}
			s0 := idem.New[string](idem.Options{Backend: cut, Now: clock.Now, Lease: lease, Logger: quiet})
			defer closeWithin(t, s0, 5*time.Second)
			o1 := idem.Options{Backend: mem, Now: clock.Now, Lease: lease, Logger: quiet}
			if mode == "Resume" {
				o1.Resume = true
			} else {
				o1.RetryInterrupted = true
			}
			s1 := idem.New[string](o1)
			defer closeWithin(t, s1, 5*time.Second)

			octx, first := ownerRunning(s0, "k")
			clock.Advance(2 * time.Hour)

			v, overlapped, err := takeOver(s1, "k", octx)
			require.NoError(t, err)
			assert.Equal(t, "second", v)
			assert.False(t, overlapped, "the key was taken over while its partitioned owner still trusted its lease: fn ran twice at once")
			assert.ErrorIs(t, <-first, idem.ErrLeaseLost)
		})
	}
}
