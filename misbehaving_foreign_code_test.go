package idem_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/stretchr/testify/assert"
)

// wildCodec is JSON, but misbehaves as its test says.
type wildCodec struct{ wild func(string) }

func (c wildCodec) Marshal(v any) ([]byte, error) { c.wild("Marshal"); return json.Marshal(v) }
func (c wildCodec) Unmarshal(data []byte, v any) error {
	c.wild("Unmarshal")
	return json.Unmarshal(data, v)
}

// The clock, the Observer's every hook and the Codec panic or end the
// goroutine (runtime.Goexit) at random, on callers' goroutines and on
// the store's own (RunOnce's, when the caller's ctx can end; the lease's;
// the recorder's; the sweeper's): no panic escapes, Close returns, and
// once they behave, every key runs or replays.
func TestMisbehavingForeignCodeStrandsNothing(t *testing.T) {
	mem := idemtest.NewMemoryBackend()
	var mu sync.Mutex
	rng := rand.New(rand.NewPCG(7, 8))
	var sick atomic.Bool
	sick.Store(true)
	wild := func(what string) {
		if !sick.Load() {
			return
		}
		mu.Lock()
		n := rng.IntN(20)
		mu.Unlock()
		switch n {
		case 0:
			panic(what + " panicked")
		case 1:
			runtime.Goexit()
		}
	}
	obs := &idem.Observer{
		Call:      func(context.Context, string, idem.Outcome, time.Duration) { wild("Call") },
		Executing: func(context.Context, int) { wild("Executing") },
		Span: func(ctx context.Context, phase, key string) (context.Context, func(error)) {
			wild("Span")
			return ctx, func(error) { wild("Span's end") }
		},
		Sweep:       func(context.Context, int, error) { wild("Sweep") },
		NotRecorded: func(context.Context, string, error) { wild("NotRecorded") },
	}
	opts := idem.Options{
		Backend:       mem,
		Lease:         100 * time.Millisecond,
		SettleTimeout: 100 * time.Millisecond,
		SweepInterval: 5 * time.Millisecond,
		Resume:        true,
		Now:           func() time.Time { wild("Now"); return time.Now() },
		Observer:      obs,
		Codec:         wildCodec{wild},
		Logger:        slog.New(slog.DiscardHandler),
	}
	s := idem.New[string](opts)
	const keys, callers = 6, 4
	var escaped atomic.Value
	var wg sync.WaitGroup
	for k := range keys {
		key := fmt.Sprintf("k%d", k)
		for c := range callers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				catchEscape(&escaped, func() {
					ctx := context.Background()
					if c%2 == 0 { // fn then runs on RunOnce's own goroutine
						var cancel context.CancelFunc
						ctx, cancel = context.WithTimeout(ctx, 5*time.Second)
						defer cancel()
					}
					_, _ = s.RunOnce(ctx, key, "p", func(ctx context.Context) (string, error) {
						if _, err := idem.Step(ctx, "a", func(context.Context) (int, error) { return 1, nil }); err != nil {
							return "", err
						}
						select {
						case <-time.After(150 * time.Millisecond): // past a renewal
						case <-ctx.Done():
							return "", context.Cause(ctx)
						}
						return "done " + key, nil
					})
				})
			}()
		}
	}
	wg.Wait()
	assert.Nil(t, escaped.Load(), "a panic escaped the library")
	closeWithin(t, s, 10*time.Second)

	sick.Store(false)
	s = idem.New[string](opts)
	defer closeWithin(t, s, 10*time.Second)
	everyKeyAnswers(t, s, keys)
}
