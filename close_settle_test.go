package idem_test

import (
	"context"
	"errors"
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

// hangingWrites is a backend whose writes after the claim (Complete,
// Release, Renew) never answer: each returns only when its ctx ends, as a
// client does against a server that has stopped replying.
type hangingWrites struct{ backend.Backend }

func (hangingWrites) Complete(ctx context.Context, _ backend.Record, _ time.Time, _ time.Duration) error {
	<-ctx.Done()
	return ctx.Err()
}

func (hangingWrites) Release(ctx context.Context, _, _ string) error {
	<-ctx.Done()
	return ctx.Err()
}

func (hangingWrites) Renew(ctx context.Context, _, _ string, _ time.Time, _ time.Duration) error {
	<-ctx.Done()
	return ctx.Err()
}

// Close against a backend that stops answering once keys are claimed: an
// outcome memory holds while its Complete hangs (its lease's renewals
// hanging too), and a release of unknown fate still being tried. Close
// returns one settle timeout after the executions ended, however the
// background work is placed then, and Shutdown says what it gave up.
func TestCloseReturnsWithinOneSettleTimeoutWhenWritesHang(t *testing.T) {
	const settle = 300 * time.Millisecond
	b := hangingWrites{idemtest.NewMemoryBackend()}
	s := idem.New[order](idem.Options{Backend: b, Lease: 90 * time.Millisecond, SettleTimeout: settle, Logger: slog.New(slog.DiscardHandler)})
	v, err := s.RunOnce(context.Background(), "done", "p", func(context.Context) (order, error) { return order{1, 1}, nil })
	require.NoError(t, err, "answered as recorded: memory holds it")
	assert.Equal(t, order{1, 1}, v)
	_, err = s.RunOnce(context.Background(), "failed", "p", func(context.Context) (order, error) {
		return order{}, errors.New("before commit")
	})
	require.Error(t, err)

	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- s.Shutdown(context.Background()) }()
	select {
	case err = <-done:
	case <-time.After(settle + 5*time.Second):
		t.Fatal("Close did not return")
	}
	took := time.Since(start)
	assert.Error(t, err, "Shutdown says the outcome was not recorded")
	assert.Less(t, took, settle+2*time.Second, "Close waited well past one settle timeout")
	closeWithin(t, s, time.Second) // and a later Close returns at once
}

// Close gives a success the Backend has not yet taken time to be recorded
// once the Backend is back, so that Shutdown's nil means it was recorded and
// the next store, with RetryInterrupted, does not run the success again.
func TestCloseRecordsAHeldOutcomeOnceTheBackendIsBack(t *testing.T) {
	mem := idemtest.NewMemoryBackend()
	var down atomic.Bool
	down.Store(true)
	opts := idem.Options{SweepInterval: -1, SettleTimeout: 200 * time.Millisecond, Lease: 100 * time.Millisecond, RetryInterrupted: true}
	opts.Backend = idemtest.Faulty{Backend: mem, Fail: func(op string) error {
		if op == "Complete" && down.Load() {
			return errors.New("blip")
		}
		return nil
	}}
	var runs atomic.Int32
	fn := func(context.Context) (int, error) { runs.Add(1); return 7, nil }
	s := idem.New[int](opts)
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
	s2 := idem.New[int](opts)
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
	s := idem.New[int](idem.Options{SweepInterval: -1, SettleTimeout: 50 * time.Millisecond, Backend: idemtest.Faulty{
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

// An Observer.Sweep that does not return does not hold Shutdown past its
// ctx.
func TestShutdownDoesNotWaitForAStuckSweeperPastItsContext(t *testing.T) {
	entered, gate := make(chan struct{}), make(chan struct{})
	var once atomic.Bool
	s := idem.New[int](idem.Options{SweepInterval: time.Millisecond, Observer: &idem.Observer{
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
