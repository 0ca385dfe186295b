package idem_test

import (
	"context"
	"errors"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemtest"
)

// Found by helper-36's attack on the core (each failed before its fix).

// A RecordStep whose reply was lost had landed: the run failed, released
// the claim with the step, and the next run charged again. The step is
// now read back.
func TestLostRecordStepReplyRunsTheStepOnce(t *testing.T) {
	mem := idemtest.NewMemoryBackend()
	var lost atomic.Bool
	b := idemtest.Faulty{Backend: mem, Lose: func(op string) error {
		if op == "RecordStep" && lost.CompareAndSwap(false, true) {
			return errors.New("connection reset by peer")
		}
		return nil
	}}
	s := New[int](Options{SweepInterval: -1, Resume: true, Backend: b})
	defer s.Close()
	var charges atomic.Int32
	fn := func(ctx context.Context) (int, error) {
		return Step(ctx, "charge", func(context.Context) (int, error) { charges.Add(1); return 1, nil })
	}
	if _, err := s.RunOnce(context.Background(), "k", "p", fn); err != nil {
		t.Fatalf("the step landed; the run failed: %v", err)
	}
	_, _ = s.RunOnce(context.Background(), "k", "p", fn)
	if n := charges.Load(); n != 1 {
		t.Errorf("the step ran %d times; its outcome had been recorded the first time", n)
	}
}

// An owner whose lease was lost, while another store resumed the key and
// ran "ship", then reached Step("ship"): it ran ship again.
func TestStepDoesNotStartAfterTheLeaseIsLost(t *testing.T) {
	mem := idemtest.NewMemoryBackend()
	var partitioned atomic.Bool
	a := New[int](Options{SweepInterval: -1, SettleTimeout: 50 * time.Millisecond, Resume: true, Lease: 300 * time.Millisecond,
		Backend: idemtest.Faulty{Backend: mem, Fail: func(op string) error {
			if partitioned.Load() && op != "RecordStep" {
				return errors.New("partition")
			}
			return nil
		}}})
	b := New[int](Options{SweepInterval: -1, Resume: true, Lease: 300 * time.Millisecond, Backend: mem})
	defer a.Close()
	defer b.Close()
	var ships atomic.Int32
	ship := func(context.Context) (int, error) { ships.Add(1); return 1, nil }
	bDone, aDone := make(chan struct{}), make(chan error, 1)
	go func() {
		_, err := a.RunOnce(context.Background(), "k", "p", func(ctx context.Context) (int, error) {
			partitioned.Store(true)
			<-ctx.Done() // ErrLeaseLost
			<-bDone
			_, err := Step(ctx, "ship", ship)
			return 0, err
		})
		aDone <- err
	}()
	deadline := time.Now().Add(10 * time.Second)
	for { // A's lease lapses in the backend
		if rec, _, _ := mem.Get(context.Background(), "k", time.Now()); rec.State == backend.StateInterrupted {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the lease never lapsed")
		}
		time.Sleep(5 * time.Millisecond) // the lease's own time passing
	}
	_, _ = b.RunOnce(context.Background(), "k", "p", func(ctx context.Context) (int, error) { return Step(ctx, "ship", ship) })
	close(bDone)
	<-aDone
	if n := ships.Load(); n != 1 {
		t.Errorf("ship ran %d times", n)
	}
}

type closingOnForget struct {
	*idemtest.MemoryBackend
	close func()
}

func (c closingOnForget) Forget(ctx context.Context, key string, now time.Time) error {
	err := c.MemoryBackend.Forget(ctx, key, now)
	c.close()
	return err
}

// A Close between the backend's delete and memory's: Forget said
// ErrClosed, yet the record was gone.
func TestForgetThatLandedIsNotReportedClosed(t *testing.T) {
	mem := idemtest.NewMemoryBackend()
	var s *Store[int]
	s = New[int](Options{SweepInterval: -1, Backend: closingOnForget{mem, func() { go s.Close() }}})
	if _, err := s.RunOnce(context.Background(), "k", "p", func(context.Context) (int, error) { return 1, nil }); err != nil {
		t.Fatal(err)
	}
	err := s.Forget(context.Background(), "k")
	if _, ok, _ := mem.Get(context.Background(), "k", time.Now()); err != nil && !ok {
		t.Errorf("Forget returned %v, yet the record is gone", err)
	}
}

// Close gave a success the Backend had not yet taken no time at all to be
// recorded, though the Backend was back; Shutdown then said nil, and with
// RetryInterrupted the next store ran the success again.
func TestCloseRecordsAHeldOutcomeOnceTheBackendIsBack(t *testing.T) {
	mem := idemtest.NewMemoryBackend()
	var down atomic.Bool
	down.Store(true)
	opts := Options{SweepInterval: -1, SettleTimeout: 200 * time.Millisecond, Lease: 100 * time.Millisecond, RetryInterrupted: true}
	opts.Backend = idemtest.Faulty{Backend: mem, Fail: func(op string) error {
		if op == "Complete" && down.Load() {
			return errors.New("blip")
		}
		return nil
	}}
	var runs atomic.Int32
	fn := func(context.Context) (int, error) { runs.Add(1); return 7, nil }
	s := New[int](opts)
	if v, err := s.RunOnce(context.Background(), "k", "p", fn); v != 7 {
		t.Fatal(v, err)
	}
	down.Store(false) // the backend is back
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if rec, _, _ := mem.Get(context.Background(), "k", time.Now()); rec.State != backend.StateCompleted {
		t.Fatalf("Shutdown returned nil, yet the success is not recorded (state %v)", rec.State)
	}
	opts.Backend = mem
	s2 := New[int](opts)
	defer s2.Close()
	if _, err := s2.RunOnce(context.Background(), "k", "p", fn); err != nil {
		t.Fatal(err)
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("a success ran %d times", n)
	}
}

// A backend that never takes the outcome: Shutdown says it gave up.
func TestShutdownSaysItGaveUpAHeldOutcome(t *testing.T) {
	s := New[int](Options{SweepInterval: -1, SettleTimeout: 50 * time.Millisecond, Backend: idemtest.Faulty{
		Backend: idemtest.NewMemoryBackend(),
		Fail: func(op string) error {
			if op == "Complete" {
				return errors.New("down")
			}
			return nil
		}}})
	_, _ = s.RunOnce(context.Background(), "k", "p", func(context.Context) (int, error) { return 7, nil })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.Shutdown(ctx); err == nil {
		t.Error("Shutdown said nil, yet it gave up recording an outcome")
	}
}

// An Observer.Sweep that does not return held Shutdown past its ctx.
func TestShutdownDoesNotWaitForAStuckSweeperPastItsContext(t *testing.T) {
	entered, gate := make(chan struct{}), make(chan struct{})
	var once atomic.Bool
	s := New[int](Options{SweepInterval: time.Millisecond, Observer: &Observer{
		Sweep: func(context.Context, int, error) {
			if once.CompareAndSwap(false, true) {
				close(entered)
				<-gate
			}
		},
	}})
	defer func() { close(gate); s.Close() }()
	<-entered
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Shutdown(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Shutdown with an ended ctx, behind a stuck sweeper: %v", err)
	}
}

// A Goexit in the Observer's Executing(+1), without a Backend: the key was
// released, but the gauge and the execute span were never ended.
func TestGoexitInExecutingEndsTheSpanAndTheGauge(t *testing.T) {
	var open, gauge atomic.Int32
	var armed atomic.Bool
	armed.Store(true)
	s := New[int](Options{SweepInterval: -1, Observer: &Observer{
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
	if _, err := s.RunOnce(context.Background(), "k", "p", func(context.Context) (int, error) { return 2, nil }); !errors.Is(err, ErrClosed) {
		t.Errorf("after Close: %v", err)
	}
}
