package idem_test

import (
	"context"
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

// A Backend whose Resume ends the goroutine (runtime.Goexit) after the
// takeover landed, or whose read-back after a lost Resume reply does,
// leaves a claim of unknown fate under the caller's fresh token. It must
// not hold the key for its lease (an hour here): the next call resumes it
// at once, its steps kept.
func TestResumeThatExitsDoesNotHoldTheKey(t *testing.T) {
	for _, where := range []string{"Resume", "Get"} {
		t.Run(where, func(t *testing.T) {
			mem := idemtest.NewMemoryBackend()
			ctx := context.Background()
			fp := mustFingerprint(t, "p")
			_, _, err := mem.Claim(ctx, backend.Record{Key: "k", Fingerprint: fp, Token: "dead", State: backend.StatePending}, time.Now(), time.Hour)
			require.NoError(t, err)
			require.NoError(t, mem.RecordStep(ctx, "k", "dead", backend.Step{Name: "a", Value: []byte("7")}, time.Now()))
			mem.Crash() // its owner is proven dead: taken over at once

			var armed, resumed atomic.Bool
			armed.Store(true)
			b := idemtest.Faulty{Backend: mem, Lose: func(op string) error {
				switch {
				case op == "Resume" && where == "Resume" && armed.CompareAndSwap(true, false):
					misbehave("goexit", op)
				case op == "Resume" && where == "Get":
					resumed.Store(true)
					return errLost
				case op == "Get" && where == "Get" && resumed.Load() && armed.CompareAndSwap(true, false):
					misbehave("goexit", op)
				}
				return nil
			}}
			s := idem.New[string](idem.Options{Backend: b, Resume: true, Lease: time.Hour, SettleTimeout: time.Second, Logger: slog.New(slog.DiscardHandler)})
			defer closeWithin(t, s, 5*time.Second)
			run := func(ctx context.Context) (string, error) {
				v, err := idem.Step(ctx, "a", func(context.Context) (int, error) { return 1, nil })
				return "got " + string(rune('0'+v)), err
			}
			escaped, exited := isolated(func() { _, _ = s.RunOnce(ctx, "k", "p", run) })
			require.Nil(t, escaped)
			require.True(t, exited)

			wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			v, err := s.RunOnce(wctx, "k", "p", run)
			require.NoError(t, err, "the key was held by the claim the Resume left")
			assert.Equal(t, "got 7", v, "resumed from its recovery point")
		})
	}
}
