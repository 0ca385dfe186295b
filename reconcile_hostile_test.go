package idem_test

import (
	"context"
	"errors"
	"math/rand"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/seed094d4201/idem/internal/txrun"
	"github.com/stretchr/testify/require"
)

// hookBackend wraps a MemoryBackend with hooks after Get and before Complete.
type hookBackend struct {
	*idemtest.MemoryBackend
	afterGet       func()
	beforeComplete func(rec backend.Record)
	failComplete   func(rec backend.Record) error
}

func (h *hookBackend) Get(ctx context.Context, key string, now time.Time) (backend.Record, bool, error) {
	r, ok, err := h.MemoryBackend.Get(ctx, key, now)
	if f := h.afterGet; f != nil {
		h.afterGet = nil
		f()
	}
	return r, ok, err
}

func (h *hookBackend) Complete(ctx context.Context, rec backend.Record, now time.Time, ttl time.Duration) error {
	if f := h.beforeComplete; f != nil {
		h.beforeComplete = nil
		f(rec)
	}
	if f := h.failComplete; f != nil {
		if err := f(rec); err != nil {
			return err
		}
	}
	return h.MemoryBackend.Complete(ctx, rec, now, ttl)
}

// interruptedKey leaves key interrupted in mem (claimed, then "crashed").
func interruptedKey(t *testing.T, mem *idemtest.MemoryBackend, key string) {
	t.Helper()
	s := New[string](Options{Backend: mem, SweepInterval: -1})
	tk, err := s.Begin(context.Background(), key, nil)
	if err != nil {
		t.Fatal(err)
	}
	_ = tk
	mem.Crash()
	// Do not Close s (it would wait for the ticket); drop it. The ticket's
	// finalizer may later try to release: its token no longer matches after
	// Resolve, harmless.
	runtime.KeepAlive(tk)
}

// Two operators resolve the same interrupted key with different outcomes at
// the same time: only one outcome can be recorded, so one must be told
// ErrNotInterrupted. Both are told nil.
func TestHostileConcurrentResolveBothSucceed(t *testing.T) {
	mem := idemtest.NewMemoryBackend()
	interruptedKey(t, mem, "m3")
	hb := &hookBackend{MemoryBackend: mem}
	opA := newStore[string](t, Options{Backend: hb, SweepInterval: -1})
	opB := newStore[string](t, Options{Backend: mem, SweepInterval: -1})
	var errB error
	hb.beforeComplete = func(backend.Record) { // B runs entirely inside A's Get→Complete window
		errB = opB.Resolve(context.Background(), "m3", "B", nil)
	}
	errA := opA.Resolve(context.Background(), "m3", "A", nil)
	got, err := opB.RunOnce(context.Background(), "m3", nil, func(context.Context) (string, error) { return "ran", nil })
	t.Logf("Resolve A: %v; Resolve B: %v; replayed: %q, %v", errA, errB, got, err)
	if errA == nil && errB == nil {
		t.Fatalf("both Resolves reported success, but only %q was recorded", got)
	}
}

// The owner comes back and records its real outcome between the operator's
// Get and Complete: Resolve documents ErrNotInterrupted ("its owner records
// after all"), but it reports success though its outcome was not recorded.
func TestHostileResolveRacesOwnerComplete(t *testing.T) {
	clock := newFakeClock()
	mem := idemtest.NewMemoryBackend()
	var un idemtest.Unrecorded
	owner := New[string](Options{Backend: mem, Now: clock.Now, Lease: time.Hour, SweepInterval: -1, Observer: un.Observer()})
	tk, err := owner.Begin(context.Background(), "m3", nil)
	if err != nil {
		t.Fatal(err)
	}
	clock.Advance(2 * time.Hour) // the owner's lease lapsed by the backend's clock: interrupted
	hb := &hookBackend{MemoryBackend: mem}
	op := newStore[string](t, Options{Backend: hb, Now: clock.Now, SweepInterval: -1})
	var ownerVal string
	var ownerErr error
	hb.afterGet = func() { ownerVal, ownerErr = tk.Finish("owner's real outcome", nil) }
	rerr := op.Resolve(context.Background(), "m3", "operator's outcome", nil)
	owner.Close()
	rec, _, _ := mem.Get(context.Background(), "m3", clock.Now())
	t.Logf("owner Finish: %q %v; Resolve: %v; recorded value: %s", ownerVal, ownerErr, rerr, rec.Value)
	if rerr == nil && !strings.Contains(string(rec.Value), "operator") {
		t.Fatalf("Resolve returned nil but the backend replays the owner's outcome %s; want ErrNotInterrupted", rec.Value)
	}
}

// The reverse order: the operator resolves first, then the owner (lease
// lapsed) finishes: the owner is told its outcome was recorded, though the
// backend replays the operator's.
func TestHostileOwnerFinishAfterResolveToldRecorded(t *testing.T) {
	clock := newFakeClock()
	mem := idemtest.NewMemoryBackend()
	var un idemtest.Unrecorded
	owner := New[string](Options{Backend: mem, Now: clock.Now, Lease: time.Hour, SweepInterval: -1, Observer: un.Observer()})
	tk, err := owner.Begin(context.Background(), "m3", nil)
	if err != nil {
		t.Fatal(err)
	}
	clock.Advance(2 * time.Hour)
	op := newStore[string](t, Options{Backend: mem, Now: clock.Now, SweepInterval: -1})
	if err := op.Resolve(context.Background(), "m3", "operator", nil); err != nil {
		t.Fatal(err)
	}
	v, ferr := tk.Finish("owner", nil)
	owner.Close()
	rec, _, _ := mem.Get(context.Background(), "m3", clock.Now())
	t.Logf("owner Finish: %q %v; recorded %s", v, ferr, rec.Value)
	if un.Of("m3") == nil && !strings.Contains(string(rec.Value), "owner") {
		t.Fatalf("owner's Finish returned (%q, %v) and no Observer heard it was not recorded, but the backend replays %s", v, ferr, rec.Value)
	}
}

// An Observer whose Executing panics (user code) strands the key: the panic
// escapes Begin after the key was claimed, and nothing ever releases it.
func TestHostileObserverPanicStrandsKey(t *testing.T) {
	obs := &Observer{Executing: func(ctx context.Context, d int) {
		if d > 0 {
			panic("observer bug")
		}
	}}
	s := New[string](Options{Observer: obs, SweepInterval: -1})
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

// An Observer.Call that panics when told of an execution crashes the whole
// process from RunOnce's own goroutine: the user cannot recover it.
func TestHostileObserverCallPanicCrashesProcess(t *testing.T) {
	if os.Getenv("REVIEW11_CHILD") == "1" {
		obs := &Observer{Call: func(ctx context.Context, key string, o Outcome, d time.Duration) {
			if o == OutcomeExecuted {
				panic("observer bug")
			}
		}}
		s := New[string](Options{Observer: obs, SweepInterval: -1})
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		func() {
			defer func() { recover() }() // the user tries to contain it
			s.RunOnce(ctx, "k", nil, func(context.Context) (string, error) { return "ok", nil })
		}()
		time.Sleep(200 * time.Millisecond)
		os.Exit(0)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestHostileObserverCallPanicCrashesProcess$")
	cmd.Env = append(os.Environ(), "REVIEW11_CHILD=1")
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

func (c *countingObserver) observer() *Observer {
	return &Observer{
		Call:      func(context.Context, string, Outcome, time.Duration) { c.calls.Add(1) },
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
func TestHostileObserverBalanced(t *testing.T) {
	for _, withBackend := range []bool{false, true} {
		c := &countingObserver{}
		opts := Options{Observer: c.observer(), SweepInterval: -1, SettleTimeout: 200 * time.Millisecond}
		if withBackend {
			opts.Backend = &flaky{MemoryBackend: idemtest.NewMemoryBackend(), rnd: rand.New(rand.NewSource(1))}
		}
		s := New[int](opts)
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
							return 1, Final(errors.New("f"))
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
func TestHostileObserverAbandonedTicket(t *testing.T) {
	c := &countingObserver{}
	s := New[int](Options{Observer: c.observer(), SweepInterval: -1, Backend: idemtest.NewMemoryBackend()})
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

// Records with a cancelled ctx, without a Lister, with expiring keys.
func TestHostileRecords(t *testing.T) {
	clock := newFakeClock()
	mem := idemtest.NewMemoryBackend()
	s := newStore[int](t, Options{Backend: mem, Now: clock.Now, TTL: time.Minute, SweepInterval: -1})
	for _, k := range []string{"a", "b", "c"} {
		s.RunOnce(context.Background(), k, nil, func(context.Context) (int, error) { return 1, nil })
	}
	clock.Advance(2 * time.Minute)
	n := 0
	for _, err := range s.Records(context.Background()) {
		if err != nil {
			t.Fatal(err)
		}
		n++
	}
	if n != 0 {
		t.Errorf("expired records listed: %d", n)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, err := range s.Records(ctx) {
		t.Logf("cancelled ctx: %v", err)
	}
	plain := newStore[int](t, Options{SweepInterval: -1})
	for _, err := range plain.Records(context.Background()) {
		if !errors.Is(err, ErrNotListable) {
			t.Errorf("no backend: %v", err)
		}
	}
	if err := plain.Resolve(context.Background(), "a", 1, nil); !errors.Is(err, ErrNotInterrupted) {
		t.Errorf("memory-only Resolve: %v", err)
	}
}

func runtimeGC() { runtime.GC() }

type rvClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *rvClock { return &rvClock{now: time.Now().UTC().Truncate(time.Second)} }
func (c *rvClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}
func (c *rvClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func newStore[R any](t *testing.T, opts Options) *Store[R] {
	t.Helper()
	s := New[R](opts)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// Found by TestHostileObserverBalanced in CI: the Observer hears an
// execution's end after its waiters wake, and Close returned before it had,
// so a gauge read after Close still counted one execution. Close and
// Shutdown now wait for the Observer's last word.
func TestCloseWaitsForTheObserversLastWord(t *testing.T) {
	entered, gate := make(chan struct{}), make(chan struct{})
	var executing atomic.Int64
	s := New[int](Options{SweepInterval: -1, Observer: &Observer{
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
