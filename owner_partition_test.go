package idem_test

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
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

			owner := make(chan context.Context, 1)
			first := make(chan error, 1)
			go func() {
				_, err := s0.RunOnce(context.Background(), "k", "p", func(ctx context.Context) (string, error) {
					owner <- ctx
					<-ctx.Done() // honours its context
					return "", context.Cause(ctx)
				})
				first <- err
			}()
			octx := <-owner
			clock.Advance(2 * time.Hour)

			var overlapped atomic.Bool
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			v, err := s1.RunOnce(ctx, "k", "p", func(context.Context) (string, error) {
				select {
				case <-octx.Done():
				default:
					overlapped.Store(true)
				}
				return "second", nil
			})
			require.NoError(t, err)
			assert.Equal(t, "second", v)
			assert.False(t, overlapped.Load(), "the key was taken over while its partitioned owner still trusted its lease: fn ran twice at once")
			assert.ErrorIs(t, <-first, idem.ErrLeaseLost)
		})
	}
}
