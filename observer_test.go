package idem_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"math/rand"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/seed094d4201/idem/internal/txrun"
	"github.com/stretchr/testify/require"
)

// An Observer whose Executing panics (user code) strands no key: the panic
// does not escape Begin after the key was claimed, and the key is released.
func TestObserverExecutingPanicStrandsNoKey(t *testing.T) {
	obs := &idem.Observer{Executing: func(ctx context.Context, d int) {
		if d > 0 {
			panic("observer bug")
		}
	}}
	s := idem.New[string](idem.Options{Observer: obs, SweepInterval: -1})
	func() {
		defer func() {
			if v := recover(); v != nil {
				t.Errorf("the Observer's panic escaped Begin: %v", v)
			}
		}()
		tk, err := s.Begin(context.Background(), "k", nil)
		if err != nil {
			t.Errorf("Begin: %v", err)
			return
		}
		tk.Release()
	}()
	obs.Executing = nil
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err := s.RunOnce(ctx, "k", nil, func(context.Context) (string, error) { return "ran", nil })
	closed := make(chan struct{})
	go func() { s.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(time.Second):
		t.Errorf("Close hangs: the stranded claim is counted as running forever")
	}
	if err != nil {
		t.Fatalf("after an Observer panic the key is stranded: RunOnce = %v", err)
	}
}

// An Observer.Call that panics when told of an execution does not crash the
// process: the panic stays inside the library, on RunOnce's goroutine and on
// any goroutine of the store's own, where the user could not recover it.
func TestObserverCallPanicStaysInTheLibrary(t *testing.T) {
	if os.Getenv("IDEM_OBSERVER_CALL_PANIC_CHILD") == "1" {
		obs := &idem.Observer{Call: func(ctx context.Context, key string, o idem.Outcome, d time.Duration) {
			if o == idem.OutcomeExecuted {
				panic("observer bug")
			}
		}}
		s := idem.New[string](idem.Options{Observer: obs, SweepInterval: -1})
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		func() {
			defer func() { recover() }() // the user tries to contain it
			s.RunOnce(ctx, "k", nil, func(context.Context) (string, error) { return "ok", nil })
		}()
		time.Sleep(200 * time.Millisecond)
		os.Exit(0)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestObserverCallPanicStaysInTheLibrary$")
	cmd.Env = append(os.Environ(), "IDEM_OBSERVER_CALL_PANIC_CHILD=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		lines := strings.SplitN(string(out), "\n", 4)
		t.Fatalf("the process died: %v\n%s", err, strings.Join(lines[:min(3, len(lines))], "\n"))
	}
}

// countingObserver counts everything, for balance checks.
type countingObserver struct {
	calls, executing, spansStarted, spansEnded, doubleEnd atomic.Int64
}

func (c *countingObserver) observer() *idem.Observer {
	return &idem.Observer{
		Call:      func(context.Context, string, idem.Outcome, time.Duration) { c.calls.Add(1) },
		Executing: func(_ context.Context, d int) { c.executing.Add(int64(d)) },
		Span: func(ctx context.Context, phase, key string) (context.Context, func(error)) {
			c.spansStarted.Add(1)
			var once atomic.Bool
			return ctx, func(error) {
				if !once.CompareAndSwap(false, true) {
					c.doubleEnd.Add(1)
				}
				c.spansEnded.Add(1)
			}
		},
	}
}

// flaky fails a fraction of every call.
type flaky struct {
	*idemtest.MemoryBackend
	rnd *rand.Rand
	mu  sync.Mutex
}

func (f *flaky) fail() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.rnd.Intn(10) == 0 {
		return errors.New("injected")
	}
	return nil
}
func (f *flaky) Claim(ctx context.Context, rec backend.Record, now time.Time, lease time.Duration) (backend.Record, bool, error) {
	if err := f.fail(); err != nil {
		return backend.Record{}, false, err
	}
	return f.MemoryBackend.Claim(ctx, rec, now, lease)
}
func (f *flaky) Complete(ctx context.Context, rec backend.Record, now time.Time, ttl time.Duration) error {
	if err := f.fail(); err != nil {
		return err
	}
	return f.MemoryBackend.Complete(ctx, rec, now, ttl)
}

// Under many goroutines, failures, panics, cancelled callers and dropped
// tickets: one Call per call, Executing balanced, every span ended once.
func TestObserverEventsBalanceUnderConcurrency(t *testing.T) {
	for _, withBackend := range []bool{false, true} {
		c := &countingObserver{}
		opts := idem.Options{Observer: c.observer(), SweepInterval: -1, SettleTimeout: 200 * time.Millisecond}
		if withBackend {
			opts.Backend = &flaky{MemoryBackend: idemtest.NewMemoryBackend(), rnd: rand.New(rand.NewSource(1))}
		}
		s := idem.New[int](opts)
		var wg sync.WaitGroup
		var calls atomic.Int64
		for g := 0; g < 32; g++ {
			wg.Add(1)
			go func(g int) {
				defer wg.Done()
				r := rand.New(rand.NewSource(int64(g)))
				for i := 0; i < 200; i++ {
					key := "k" + string(rune('a'+r.Intn(8)))
					ctx, cancel := context.WithTimeout(context.Background(), time.Duration(r.Intn(3))*time.Millisecond)
					if r.Intn(2) == 0 {
						ctx, cancel = context.WithCancel(context.Background())
					}
					calls.Add(1)
					switch r.Intn(4) {
					case 0:
						sleep, mode := time.Duration(r.Intn(200))*time.Microsecond, r.Intn(4)
						s.RunOnce(ctx, key, nil, func(context.Context) (int, error) {
							time.Sleep(sleep)
							switch mode {
							case 0:
								panic("boom")
							case 1:
								return 0, errors.New("transient")
							}
							return 1, idem.Final(errors.New("f"))
						})
					case 1:
						tk, err := s.Begin(ctx, key, nil)
						if err == nil {
							func() {
								defer func() { recover() }()
								defer tk.Release()
								if !tk.Replayed() && r.Intn(3) == 0 {
									panic("work panicked")
								}
								tk.Finish(2, nil)
							}()
						}
					case 2:
						tk, err := txrun.Of(s).BeginLocal(ctx, key, nil)
						if err == nil {
							tk.Release()
						}
					case 3:
						s.Forget(context.Background(), key)
						calls.Add(-1)
					}
					cancel()
				}
			}(g)
		}
		wg.Wait()
		s.Close()
		t.Logf("backend=%v calls=%d observed=%d executing=%d spans %d/%d double=%d", withBackend, calls.Load(), c.calls.Load(), c.executing.Load(), c.spansStarted.Load(), c.spansEnded.Load(), c.doubleEnd.Load())
		if c.executing.Load() != 0 || c.spansStarted.Load() != c.spansEnded.Load() || c.doubleEnd.Load() != 0 || c.calls.Load() != calls.Load() {
			t.Errorf("unbalanced (backend=%v)", withBackend)
		}
	}
}

// An abandoned ticket: its span and Executing must still end.
func TestAbandonedTicketEndsItsSpanAndExecuting(t *testing.T) {
	c := &countingObserver{}
	s := idem.New[int](idem.Options{Observer: c.observer(), SweepInterval: -1, Backend: idemtest.NewMemoryBackend()})
	func() {
		s.Begin(context.Background(), "k", nil)
	}()
	for deadline := time.Now().Add(10 * time.Second); c.executing.Load() != 0 && time.Now().Before(deadline); {
		runtimeGC()
		time.Sleep(20 * time.Millisecond)
	}
	s.Close()
	if c.executing.Load() != 0 || c.spansStarted.Load() != c.spansEnded.Load() {
		t.Fatalf("executing=%d spans %d/%d", c.executing.Load(), c.spansStarted.Load(), c.spansEnded.Load())
	}
}

// The Observer hears an execution's end after its waiters wake: Close and
// Shutdown wait for that last word, so that a gauge read after Close counts
// no execution (TestObserverEventsBalanceUnderConcurrency once saw one in CI).
func TestCloseWaitsForTheObserversLastWord(t *testing.T) {
	entered, gate := make(chan struct{}), make(chan struct{})
	var executing atomic.Int64
	s := idem.New[int](idem.Options{SweepInterval: -1, Observer: &idem.Observer{
		Executing: func(_ context.Context, d int) {
			if d < 0 {
				close(entered)
				<-gate
			}
			executing.Add(int64(d))
		},
	}})
	done := make(chan error, 1)
	go func() {
		_, err := s.RunOnce(context.Background(), "k", nil, func(context.Context) (int, error) { return 1, nil })
		done <- err
	}()
	<-entered // the key is settled; the Observer is being told
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	err := s.Shutdown(ended)
	require.ErrorIs(t, err, context.Canceled, "Shutdown returned while the Observer was still being told")
	require.Contains(t, err.Error(), "Observer is still being told: 1")
	close(gate)
	require.NoError(t, <-done)
	require.NoError(t, s.Close())
	require.Zero(t, executing.Load())
}

// A Goexit in the Observer's Executing(+1), without a Backend: the key was
// released, but the gauge and the execute span were never ended.
func TestGoexitInExecutingEndsTheSpanAndTheGauge(t *testing.T) {
	var open, gauge atomic.Int32
	var armed atomic.Bool
	armed.Store(true)
	s := idem.New[int](idem.Options{SweepInterval: -1, Observer: &idem.Observer{
		Executing: func(_ context.Context, d int) {
			gauge.Add(int32(d))
			if d > 0 && armed.CompareAndSwap(true, false) {
				runtime.Goexit()
			}
		},
		Span: func(ctx context.Context, phase, _ string) (context.Context, func(error)) {
			if phase != "idem.execute" {
				return ctx, func(error) {}
			}
			open.Add(1)
			return ctx, func(error) { open.Add(-1) }
		},
	}})
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = s.RunOnce(context.Background(), "k", "p", func(context.Context) (int, error) { return 1, nil })
	}()
	<-done
	s.Close()
	if open.Load() != 0 || gauge.Load() != 0 {
		t.Errorf("spans open %d, gauge %d", open.Load(), gauge.Load())
	}
	if _, err := s.RunOnce(context.Background(), "k", "p", func(context.Context) (int, error) { return 2, nil }); !errors.Is(err, idem.ErrClosed) {
		t.Errorf("after Close: %v", err)
	}
}

// An Observer whose Span panics, once, at the start of a Begin: the store
// recovers the panic and goes on with the caller's context, never a nil one
// (whose dereference in Begin would escape the library and leave the key in
// flight for good), so the ticket finishes and its outcome replays.
func TestSpanPanicKeepsTheCallersContext(t *testing.T) {
	for _, tc := range []struct {
		name    string
		backend bool
	}{{"memory", false}, {"durable", true}} {
		t.Run(tc.name, func(t *testing.T) {
			panics := 1
			opts := idem.Options{
				Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
				Observer: &idem.Observer{Span: func(ctx context.Context, _, _ string) (context.Context, func(error)) {
					if panics > 0 {
						panics--
						panic("a broken tracer")
					}
					return ctx, func(error) {}
				}},
			}
			if tc.backend {
				opts.Backend = idemtest.NewMemoryBackend()
			}
			s := idem.New[int](opts)
			defer closeWithin(t, s, 5*time.Second)
			ctx := context.Background()
			var tk *idem.Ticket[int]
			var err error
			func() {
				defer func() {
					if v := recover(); v != nil {
						t.Fatalf("Begin panicked: %v", v)
					}
				}()
				tk, err = s.Begin(ctx, "order-1", "p")
			}()
			if err != nil {
				t.Fatalf("Begin: %v", err)
			}
			if tk.Context() == nil {
				t.Fatal("the ticket's context is nil")
			}
			if v, err := tk.Finish(7, nil); v != 7 || err != nil {
				t.Fatalf("Finish = %d, %v", v, err)
			}
			v, err := s.RunOnce(ctx, "order-1", "p", func(context.Context) (int, error) { return 8, nil })
			if v != 7 || err != nil {
				t.Fatalf("the replay = %d, %v, want 7, nil", v, err)
			}
		})
	}
}
