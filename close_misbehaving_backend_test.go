package idem_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A Backend that panics or ends the goroutine in every Release, or every
// Complete (and every Get that would read either back), for good: the
// store goes on trying in the background, Shutdown returns within the
// settle timeout and says what it left, no panic escapes, and the process
// goes on.
func TestShutdownWithABackendThatPanicsOrExitsForGood(t *testing.T) {
	for _, how := range []string{"panic", "goexit"} {
		for _, op := range []string{"Release", "Complete"} {
			t.Run(fmt.Sprintf("%s/%s", how, op), func(t *testing.T) {
				mem := idemtest.NewMemoryBackend()
				b := idemtest.Faulty{Backend: mem, Fail: func(got string) error {
					if got == op || got == "Get" {
						misbehave(how, got)
					}
					return nil
				}}
				s := idem.New[order](idem.Options{Backend: b, SettleTimeout: 50 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
				escaped, _ := isolated(func() {
					_, _ = s.RunOnce(context.Background(), "k", "p", func(context.Context) (order, error) {
						if op == "Release" {
							return order{}, errors.New("before commit")
						}
						return order{ID: 1}, nil
					})
				})
				require.Nil(t, escaped, "a panic escaped the library")
				var err error
				escaped, _ = isolated(func() {
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					defer cancel()
					err = s.Shutdown(ctx)
				})
				require.Nil(t, escaped, "a panic escaped Shutdown")
				require.Error(t, err, "Shutdown says what it left")
				assert.NotErrorIs(t, err, context.DeadlineExceeded, "Shutdown outlasted the settle timeout: %v", err)
				if op == "Release" {
					assert.Contains(t, err.Error(), "1 claims of failed or unstarted work were not released")
				} else {
					assert.Contains(t, err.Error(), "1 outcomes")
				}
				closeWithin(t, s, 5*time.Second)
			})
		}
	}
}
