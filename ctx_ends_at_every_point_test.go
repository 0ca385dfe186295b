package idem_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/bolt"
	"github.com/seed094d4201/idem/idemtest"
)

// countdownCtx is cancelled by its own n-th call of Done, Err or Value:
// the caller hangs up at that point of the call, whatever it is.
type countdownCtx struct {
	context.Context
	cancel context.CancelFunc
	left   atomic.Int64
}

func newCountdownCtx(n int64) *countdownCtx {
	ctx, cancel := context.WithCancel(context.Background())
	c := &countdownCtx{Context: ctx, cancel: cancel}
	c.left.Store(n)
	return c
}

func (c *countdownCtx) tick() {
	if c.left.Add(-1) == 0 {
		c.cancel()
	}
}

func (c *countdownCtx) Done() <-chan struct{} { c.tick(); return c.Context.Done() }
func (c *countdownCtx) Err() error            { c.tick(); return c.Context.Err() }
func (c *countdownCtx) Value(k any) any       { c.tick(); return c.Context.Value(k) }

// A caller that hangs up at any point of its call (its ctx cancelled at
// its n-th look at it, for every n until a call no longer looks that
// often) leaves its key neither stuck nor run twice: the next call, whose
// ctx never ends, replays the outcome a caller was told, or runs fn once
// more, never while another run is under way, and Close returns.
func TestCallerThatHangsUpAtEveryPointLeavesItsKeySound(t *testing.T) {
	backends := []struct {
		name string
		open func(t *testing.T) backend.Backend
	}{
		{"memory", func(*testing.T) backend.Backend { return nil }},
		{"MemoryBackend", func(*testing.T) backend.Backend { return idemtest.NewMemoryBackend() }},
		{"bolt", func(t *testing.T) backend.Backend {
			b, err := bolt.Open(filepath.Join(t.TempDir(), "keys.db"), nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = b.Close() })
			return b
		}},
	}
	for _, bk := range backends {
		for _, api := range []string{"RunOnce", "Begin"} {
			t.Run(bk.name+"/"+api, func(t *testing.T) {
				b := bk.open(t)
				s := idem.New[int](idem.Options{Backend: b, Lease: time.Second, SettleTimeout: 100 * time.Millisecond,
					Resume: b != nil, Logger: slog.New(slog.DiscardHandler)})
				defer closeWithin(t, s, 5*time.Second)
				for n := int64(1); n < 200; n++ {
					key := fmt.Sprintf("k%d", n)
					var runs, running atomic.Int32
					fn := func(ctx context.Context) (int, error) {
						if running.Add(1) != 1 {
							t.Errorf("%s: fn ran twice at once", key)
						}
						defer running.Add(-1)
						runs.Add(1)
						if _, err := idem.Step(ctx, "a", func(context.Context) (int, error) { return 1, nil }); err != nil {
							return 0, err
						}
						return 1, nil
					}
					ctx := newCountdownCtx(n)
					var err error
					var wg sync.WaitGroup
					wg.Add(1)
					go func() {
						defer wg.Done()
						if api == "RunOnce" {
							_, err = s.RunOnce(ctx, key, "p", fn)
							return
						}
						tk, berr := s.Begin(ctx, key, "p")
						if berr != nil {
							err = berr
							return
						}
						defer tk.Release()
						_, err = tk.Do(fn)
					}()
					wg.Wait()
					hungUp := ctx.left.Load() <= 0
					told := err == nil
					next, cancel := context.WithTimeout(context.Background(), 3*time.Second)
					got, err2 := s.RunOnce(context.WithoutCancel(next), key, "p", fn)
					cancel()
					switch {
					case err2 != nil:
						t.Fatalf("n=%d: after a caller that hung up (%v): %v", n, err, err2)
					case got != 1:
						t.Fatalf("n=%d: got %d", n, got)
					case told && runs.Load() != 1:
						t.Fatalf("n=%d: the first caller was told of a success, and fn ran %d times", n, runs.Load())
					case runs.Load() > 2:
						t.Fatalf("n=%d: fn ran %d times", n, runs.Load())
					case err != nil && !errors.Is(err, idem.ErrInProgress) && !errors.Is(err, context.Canceled):
						t.Fatalf("n=%d: the caller that hung up got %v", n, err)
					}
					if !hungUp {
						t.Logf("hung up at each of %d points", n-1)
						return // the call no longer looks at its ctx n times
					}
				}
				t.Fatal("the call still looks at its ctx 200 times")
			})
		}
	}
}
