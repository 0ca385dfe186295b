package idem_test

import (
	"context"
	"encoding/json"
	"errors"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// exitingCodec ends its goroutine (as t.FailNow does) on the calls picked.
type exitingCodec struct {
	marshal, unmarshal bool
}

func (c exitingCodec) Marshal(v any) ([]byte, error) {
	if c.marshal {
		runtime.Goexit()
	}
	return json.Marshal(v)
}

func (c exitingCodec) Unmarshal(data []byte, v any) error {
	if c.unmarshal {
		runtime.Goexit()
	}
	return json.Unmarshal(data, v)
}

// inGoroutine runs f on a goroutine of its own, so that f may Goexit, and
// waits for it.
func inGoroutine(f func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	<-done
}

// closes fails the test unless s.Close returns within a few seconds.
func closes(t *testing.T, s interface{ Close() error }) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		_ = s.Close()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Close hangs: a key was left in flight")
	}
}

// runtime.Goexit in a Codec's Marshal, where an outcome is being
// recorded, settles the key all the same: Close returns, and the claim
// does not stay renewed for ever (issue 18).
func TestGoexitInCodecMarshal(t *testing.T) {
	for _, final := range []bool{false, true} {
		mem := idemtest.NewMemoryBackend()
		s := idem.New[order](idem.Options{Backend: mem, Codec: exitingCodec{marshal: true}, SettleTimeout: 50 * time.Millisecond})
		// (The Goexit ends the recording goroutine, so the Observer is
		// not told: the store only logs it.)
		out := make(chan error, 1)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second) // fn runs on a goroutine of the store's
		defer cancel()
		go func() {
			_, err := s.RunOnce(ctx, "k", "p", func(context.Context) (order, error) {
				if final {
					return order{1, 1}, nil
				}
				return order{}, errors.New("transient")
			})
			out <- err
		}()
		err := <-out
		if final {
			require.NoError(t, err, "the caller is answered its success, recorded or not")
		} else {
			require.EqualError(t, err, "transient")
			waitFor(t, absent(mem, "k"), "the failed key is released")
		}
		closes(t, s)
		if final { // the store kept the claim while it lived; now it is the owner's to reconcile
			rec, ok, err := mem.Get(context.Background(), "k", time.Now().Add(time.Hour))
			require.NoError(t, err)
			require.True(t, ok)
			assert.Equal(t, backend.StateInterrupted, rec.State)
		}
	}
}

// runtime.Goexit in a Codec's Unmarshal, decoding a replay, releases the
// key the caller held in memory.
func TestGoexitInCodecUnmarshal(t *testing.T) {
	mem := idemtest.NewMemoryBackend()
	writer := durableStore(t, mem, idem.Options{})
	_, err := writer.RunOnce(context.Background(), "k", "p", func(context.Context) (order, error) { return order{1, 1}, nil })
	require.NoError(t, err)

	s := idem.New[order](idem.Options{Backend: mem, Codec: exitingCodec{unmarshal: true}})
	inGoroutine(func() {
		_, _ = s.RunOnce(context.Background(), "k", "p", func(context.Context) (order, error) { return order{}, nil })
	})
	assert.Equal(t, 0, s.Len(), "the key was left in flight")
	closes(t, s)
}

// runtime.Goexit in an Observer hook, anywhere around a claim, leaves no
// key in flight: the next call runs, and Close returns.
func TestGoexitInObserver(t *testing.T) {
	hooks := map[string]func(exit func()) *idem.Observer{
		"Executing(+1)": func(exit func()) *idem.Observer {
			return &idem.Observer{Executing: func(_ context.Context, d int) {
				if d > 0 {
					exit()
				}
			}}
		},
		"Executing(-1)": func(exit func()) *idem.Observer {
			return &idem.Observer{Executing: func(_ context.Context, d int) {
				if d < 0 {
					exit()
				}
			}}
		},
		"Call": func(exit func()) *idem.Observer {
			return &idem.Observer{Call: func(context.Context, string, idem.Outcome, time.Duration) { exit() }}
		},
	}
	for _, phase := range []string{"idem.claim", "idem.execute", "idem.record"} {
		hooks["Span "+phase] = func(exit func()) *idem.Observer {
			return &idem.Observer{Span: func(ctx context.Context, p, _ string) (context.Context, func(error)) {
				if p == phase {
					exit()
				}
				return ctx, func(error) {}
			}}
		}
		hooks["Span end "+phase] = func(exit func()) *idem.Observer {
			return &idem.Observer{Span: func(ctx context.Context, p, _ string) (context.Context, func(error)) {
				return ctx, func(error) {
					if p == phase {
						exit()
					}
				}
			}}
		}
	}
	for name, hook := range hooks {
		for _, durable := range []bool{false, true} {
			t.Run(name, func(t *testing.T) {
				var armed atomic.Bool
				armed.Store(true)
				exit := func() {
					if armed.CompareAndSwap(true, false) {
						runtime.Goexit()
					}
				}
				opts := idem.Options{Observer: hook(exit), SettleTimeout: 50 * time.Millisecond}
				mem := idemtest.NewMemoryBackend()
				if durable {
					opts.Backend = mem
				}
				s := idem.New[order](opts)
				var calls atomic.Int32
				fn := func(context.Context) (order, error) {
					calls.Add(1)
					return order{}, errors.New("transient") // released, so the next call runs
				}
				for _, begin := range []bool{false, true} {
					inGoroutine(func() {
						ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
						defer cancel()
						if begin {
							tk, err := s.Begin(ctx, "k", "p")
							if err == nil {
								_, _ = tk.Do(fn)
							}
							return
						}
						_, _ = s.RunOnce(ctx, "k", "p", fn)
					})
					armed.Store(!begin) // again for Begin, then no more
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				_, err := s.RunOnce(ctx, "k", "p", fn)
				require.EqualError(t, err, "transient", "the key was left in flight")
				closes(t, s)
				if durable {
					_, ok, err := mem.Get(context.Background(), "k", time.Now())
					require.NoError(t, err)
					assert.False(t, ok, "the durable claim was left behind")
				}
			})
		}
	}
}

// runtime.Goexit in the Observer's NotRecorded, told of an outcome the
// Backend could not record: the caller is answered all the same, the
// store goes on holding the outcome (a second call replays it, fn does not
// run again), and Close returns.
func TestGoexitInObserverNotRecorded(t *testing.T) {
	mem := idemtest.NewMemoryBackend()
	b := idemtest.Faulty{Backend: mem, Fail: func(op string) error {
		if op == "Complete" {
			return errors.New("disk full")
		}
		return nil
	}}
	s := idem.New[order](idem.Options{Backend: b, SettleTimeout: 20 * time.Millisecond, Observer: &idem.Observer{
		NotRecorded: func(context.Context, string, error) { runtime.Goexit() },
	}})
	repliesOnce(t, s, order{4, 4})
	closes(t, s)
}

// The Observer hears of an unrecorded outcome even when the "idem.record"
// span's end ends the goroutine; its ctx has not ended with the caller's;
// and a Goexit in NotRecorded leaves no execution counted as running.
func TestNotRecordedIsToldWhateverEndsTheGoroutine(t *testing.T) {
	failing := func() backend.Backend {
		return idemtest.Faulty{Backend: idemtest.NewMemoryBackend(), Fail: func(op string) error {
			if op == "Complete" {
				return errors.New("disk full")
			}
			return nil
		}}
	}
	t.Run("span end exits", func(t *testing.T) {
		var un idemtest.Unrecorded
		obs := un.Observer()
		obs.Span = func(ctx context.Context, phase, _ string) (context.Context, func(error)) {
			return ctx, func(error) {
				if phase == "idem.record" {
					runtime.Goexit()
				}
			}
		}
		s := idem.New[order](idem.Options{Backend: failing(), SettleTimeout: 20 * time.Millisecond, Observer: obs})
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := s.RunOnce(ctx, "k", "p", func(context.Context) (order, error) { return order{1, 1}, nil })
		require.NoError(t, err)
		assert.Equal(t, 1, un.Count("k"))
		closes(t, s)
	})
	t.Run("hook ctx and gauge", func(t *testing.T) {
		var running atomic.Int32
		hookCtx := make(chan error, 1)
		s := idem.New[order](idem.Options{Backend: failing(), SettleTimeout: 20 * time.Millisecond, Observer: &idem.Observer{
			Executing: func(_ context.Context, d int) { running.Add(int32(d)) },
			NotRecorded: func(ctx context.Context, _ string, _ error) {
				hookCtx <- ctx.Err()
				runtime.Goexit()
			},
		}})
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := s.RunOnce(ctx, "k", "p", func(context.Context) (order, error) { return order{1, 1}, nil })
		require.NoError(t, err)
		assert.NoError(t, <-hookCtx, "the hook's ctx does not end with the caller's")
		closes(t, s)
		// The gauge's -1 comes after the key is settled, so Close may return
		// a moment before it: it must come, not be skipped.
		assert.Eventually(t, func() bool { return running.Load() == 0 }, time.Minute, time.Millisecond,
			"the execution is no longer counted as running")
	})
}

// A Goexit in Observer.Call leaves the Executing gauge balanced, and a
// clock (Options.Now, the user's code) that panics while an outcome is
// recorded neither crashes the process from the store's goroutine nor
// leaves the key in flight.
func TestGoexitInCallAndPanickingClock(t *testing.T) {
	t.Run("Call exits", func(t *testing.T) {
		var gauge atomic.Int32
		var armed atomic.Bool
		armed.Store(true)
		s := idem.New[int](idem.Options{Observer: &idem.Observer{
			Executing: func(_ context.Context, d int) { gauge.Add(int32(d)) },
			Call: func(context.Context, string, idem.Outcome, time.Duration) {
				if armed.CompareAndSwap(true, false) {
					runtime.Goexit()
				}
			},
		}})
		done := make(chan struct{})
		go func() {
			defer close(done)
			_, _ = s.RunOnce(context.Background(), "k", "p", func(context.Context) (int, error) { return 1, nil })
		}()
		<-done
		closes(t, s)
		assert.Zero(t, gauge.Load(), "the Executing gauge is balanced")
	})
	t.Run("clock panics", func(t *testing.T) {
		var calls atomic.Int32
		s := idem.New[int](idem.Options{Now: func() time.Time {
			if calls.Add(1) == 2 { // the claim reads it first, the outcome second
				panic("clock broke")
			}
			return time.Now()
		}})
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		v, err := s.RunOnce(ctx, "k", "p", func(context.Context) (int, error) { return 1, nil })
		require.NoError(t, err)
		assert.Equal(t, 1, v)
		v, err = s.RunOnce(ctx, "k", "p", func(context.Context) (int, error) { return 2, nil })
		require.NoError(t, err)
		assert.Equal(t, 1, v, "the outcome was kept")
		require.NoError(t, s.Shutdown(ctx))
	})
}

// A Codec that ends the recording goroutine, then a NotRecorded hook that
// ends it again: the key is settled all the same (it replays, fn does not
// run again) and Close returns.
func TestGoexitInCodecThenInNotRecorded(t *testing.T) {
	s := idem.New[order](idem.Options{Backend: idemtest.NewMemoryBackend(), Codec: exitingCodec{marshal: true},
		SettleTimeout: 20 * time.Millisecond, Observer: &idem.Observer{
			NotRecorded: func(context.Context, string, error) { runtime.Goexit() },
		}})
	repliesOnce(t, s, order{2, 2})
	closes(t, s)
}

// repliesOnce calls key "k" twice, under a ctx that can end (so fn runs on
// a goroutine of the store's), and requires the outcome want both times,
// fn having run once: the outcome is held.
func repliesOnce(t *testing.T, s *idem.Store[order], want order) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	calls, fn := countingFn(want)
	for range 2 {
		v, err := s.RunOnce(ctx, "k", "p", fn)
		require.NoError(t, err)
		assert.Equal(t, want, v)
	}
	assert.Equal(t, int32(1), calls.Load(), "the outcome is held: fn does not run again")
}
