package idem_test

import (
	"context"
	"errors"
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
