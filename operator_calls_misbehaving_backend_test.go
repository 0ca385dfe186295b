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

// The operator's calls (Store.Records, Resolve, Forget, Sweep) on a
// Backend that panics or ends the goroutine in the method they call: a
// panic is a *BackendError, no panic escapes, and once the Backend
// behaves, the same call works.
func TestOperatorCallsOnAMisbehavingBackend(t *testing.T) {
	type call struct {
		name, op string
		run      func(s *idem.Store[string]) error
	}
	calls := []call{
		{"Records", "Each", func(s *idem.Store[string]) error {
			for _, err := range s.Records(context.Background()) {
				if err != nil {
					return err
				}
			}
			return nil
		}},
		{"Resolve", "Get", func(s *idem.Store[string]) error {
			return s.Resolve(context.Background(), "k", "resolved", nil)
		}},
		{"Resolve", "Complete", func(s *idem.Store[string]) error {
			return s.Resolve(context.Background(), "k", "resolved", nil)
		}},
		{"Forget", "Forget", func(s *idem.Store[string]) error { return s.Forget(context.Background(), "k") }},
		{"Sweep", "Sweep", func(s *idem.Store[string]) error { _, err := s.Sweep(context.Background()); return err }},
	}
	for _, how := range []string{"panic", "goexit"} {
		for _, c := range calls {
			t.Run(fmt.Sprintf("%s/%s/%s", how, c.name, c.op), func(t *testing.T) {
				mem := idemtest.NewMemoryBackend()
				// An interrupted key, for Resolve.
				_, _, err := mem.Claim(context.Background(), backend.Record{Key: "k", Fingerprint: mustFingerprint(t, "p"), Token: "dead", State: backend.StatePending}, time.Now(), time.Hour)
				require.NoError(t, err)
				mem.Crash()
				var armed atomic.Bool
				armed.Store(true)
				b := idemtest.Faulty{Backend: mem, Fail: func(op string) error {
					if op == c.op && armed.CompareAndSwap(true, false) {
						misbehave(how, op)
					}
					return nil
				}}
				s := idem.New[string](idem.Options{Backend: b, SweepInterval: -1, Logger: slog.New(slog.DiscardHandler)})
				defer closeWithin(t, s, 5*time.Second)
				var got error
				escaped, exited := isolated(func() { got = c.run(s) })
				require.Nil(t, escaped, "a panic escaped the library")
				switch {
				case how == "goexit":
					assert.True(t, exited)
				case c.op == "Complete": // settled: tried again, and written
					assert.NoError(t, got)
				default:
					var be *idem.BackendError
					assert.ErrorAs(t, got, &be)
				}
				if c.name == "Resolve" {
					if rec, _, _ := mem.Get(context.Background(), "k", time.Now()); rec.State != backend.StateCompleted {
						require.NoError(t, c.run(s), "the call fails once the Backend behaves")
					}
					rec, _, err := mem.Get(context.Background(), "k", time.Now())
					require.NoError(t, err)
					assert.Equal(t, `"resolved"`, string(rec.Value))
					return
				}
				assert.NoError(t, c.run(s), "the call fails once the Backend behaves")
			})
		}
	}
}
