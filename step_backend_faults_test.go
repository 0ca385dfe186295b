package idem_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A RecordStep whose reply was lost may have landed: the step is read back
// rather than the run failing, releasing the claim with the step, and the
// next run charging again.
func TestLostRecordStepReplyRunsTheStepOnce(t *testing.T) {
	mem := idemtest.NewMemoryBackend()
	var lost atomic.Bool
	b := idemtest.Faulty{Backend: mem, Lose: func(op string) error {
		if op == "RecordStep" && lost.CompareAndSwap(false, true) {
			return errors.New("connection reset by peer")
		}
		return nil
	}}
	s := idem.New[int](idem.Options{SweepInterval: -1, Resume: true, Backend: b})
	defer s.Close()
	var charges atomic.Int32
	fn := func(ctx context.Context) (int, error) {
		return idem.Step(ctx, "charge", func(context.Context) (int, error) { charges.Add(1); return 1, nil })
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
// ran "ship", then reaches Step("ship"): the step does not start, so ship
// runs once.
func TestStepDoesNotStartAfterTheLeaseIsLost(t *testing.T) {
	mem := idemtest.NewMemoryBackend()
	var partitioned atomic.Bool
	a := idem.New[int](idem.Options{SweepInterval: -1, SettleTimeout: 50 * time.Millisecond, Resume: true, Lease: 300 * time.Millisecond,
		Backend: idemtest.Faulty{Backend: mem, Fail: func(op string) error {
			if partitioned.Load() && op != "RecordStep" {
				return errors.New("partition")
			}
			return nil
		}}})
	b := idem.New[int](idem.Options{SweepInterval: -1, Resume: true, Lease: 300 * time.Millisecond, Backend: mem})
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
			_, err := idem.Step(ctx, "ship", ship)
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
	_, _ = b.RunOnce(context.Background(), "k", "p", func(ctx context.Context) (int, error) { return idem.Step(ctx, "ship", ship) })
	close(bDone)
	<-aDone
	if n := ships.Load(); n != 1 {
		t.Errorf("ship ran %d times", n)
	}
}

// hangingStepper is a MemoryBackend whose RecordStep hangs, as a backend
// that stopped answering does, until its ctx ends (or the test releases it).
type hangingStepper struct {
	*idemtest.MemoryBackend
	release chan struct{}
}

func (h *hangingStepper) RecordStep(ctx context.Context, key, token string, s backend.Step, now time.Time) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-h.release:
		return errors.New("released by the test")
	}
}

// A backend that stops answering while a step is recorded: Step's write
// is bounded as every other write of an outcome is (ExecutionTimeout, the
// lease running out, SettleTimeout), so Step gives up with an error, and
// neither the execution nor Close hangs for ever (Close "bounds how long
// [it] waits for executions in flight, for an fn that honours its
// context": this fn does). A write under context.WithoutCancel(ctx) with
// no bound at all would hang both.
func TestStepRecordOnHungBackendIsBounded(t *testing.T) {
	h := &hangingStepper{MemoryBackend: idemtest.NewMemoryBackend(), release: make(chan struct{})}
	var once sync.Once
	unhang := func() { once.Do(func() { close(h.release) }) }
	defer unhang()
	s := idem.New[string](idem.Options{Backend: h, Resume: true,
		ExecutionTimeout: 200 * time.Millisecond, SettleTimeout: 200 * time.Millisecond, Lease: time.Second})
	stepDone := make(chan error, 1)
	go func() {
		_, _ = s.RunOnce(context.Background(), "k", "p", func(ctx context.Context) (string, error) {
			_, err := idem.Step(ctx, "charge", func(context.Context) (int, error) { return 1, nil })
			stepDone <- err
			return "", err
		})
	}()
	select {
	case err := <-stepDone:
		assert.Error(t, err)
	case <-time.After(5 * time.Second):
		t.Error("Step still recording after 5s, past ExecutionTimeout, SettleTimeout and the lease")
	}
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	select {
	case <-closed:
	case <-time.After(3 * time.Second):
		t.Error("Close held up by a step recording on a backend that does not answer")
		unhang()
		<-closed
	}
}

// slowResume is a MemoryBackend whose Resume replies late, as over a
// slow link: the resume lands at once, its reply after delay.
type slowResume struct {
	*idemtest.MemoryBackend
	delay time.Duration
}

func (h *slowResume) Resume(ctx context.Context, key, old, token string, now time.Time, lease time.Duration) (backend.Record, error) {
	rec, err := h.MemoryBackend.Resume(ctx, key, old, token, now, lease)
	time.Sleep(h.delay) // the reply's latency, not an ordering of goroutines
	return rec, err
}

// A resume whose reply comes too late to trust its lease leaves the key at
// its recovery point (the lease left to lapse) and never drops its steps:
// released as a late claim is, Release would delete the record with every
// recovery point in it, and the next call would start from scratch and run
// the recorded step again.
func TestLateResumeReplyKeepsRecordedSteps(t *testing.T) {
	mem := idemtest.NewMemoryBackend()
	plain := newStore[string](t, idem.Options{Backend: mem, Resume: true})
	atRecoveryPoint(t, plain, "k", "p")

	slow := newStore[string](t, idem.Options{Backend: &slowResume{mem, 300 * time.Millisecond}, Resume: true, Lease: 200 * time.Millisecond})
	_, err := slow.RunOnce(context.Background(), "k", "p", func(ctx context.Context) (string, error) { return "", nil })
	require.Error(t, err, "the late resume is not trusted")

	rec, ok, gerr := mem.Get(context.Background(), "k", time.Now())
	require.NoError(t, gerr)
	require.True(t, ok, "the key and its recovery points are gone")
	assert.Len(t, rec.Steps, 1)

	var reran atomic.Bool
	_, err = plain.RunOnce(context.Background(), "k", "p", func(ctx context.Context) (string, error) {
		_, err := idem.Step(ctx, "a", func(context.Context) (int, error) { reran.Store(true); return 1, nil })
		return "", err
	})
	require.NoError(t, err)
	assert.False(t, reran.Load(), "a recorded step ran again")
}

// lostResumeReply is a MemoryBackend whose Resume lands but whose reply
// is lost (the first time).
type lostResumeReply struct {
	*idemtest.MemoryBackend
	lost atomic.Bool
}

func (h *lostResumeReply) Resume(ctx context.Context, key, old, token string, now time.Time, lease time.Duration) (backend.Record, error) {
	rec, err := h.MemoryBackend.Resume(ctx, key, old, token, now, lease)
	if err == nil && h.lost.CompareAndSwap(false, true) {
		return backend.Record{}, errors.New("connection reset by peer")
	}
	return rec, err
}

// Rule 10: "A lost reply to a claim or an outcome write is resolved by
// reading the record back and comparing the token". A resume whose reply
// is lost is settled by its token too (run under it, or let lapse at once),
// so a retry resumes without waiting a lease; left unread, it would stand
// under a token nobody holds for a full lease (30s by default), every
// retry meanwhile getting ErrInProgress.
func TestLostResumeReplyIsSettledByItsToken(t *testing.T) {
	mem := idemtest.NewMemoryBackend()
	lost := &lostResumeReply{MemoryBackend: mem}
	s := newStore[string](t, idem.Options{Backend: lost, Resume: true})
	atRecoveryPoint(t, s, "k", "p")

	fn := func(ctx context.Context) (string, error) {
		v, err := idem.Step(ctx, "a", func(context.Context) (int, error) { return 2, nil })
		return fmt.Sprint(v), err
	}
	got, err := s.RunOnce(context.Background(), "k", "p", fn)
	if err != nil { // the lost reply was reported: a retry must then resume at once
		var be *idem.BackendError
		require.ErrorAs(t, err, &be)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		got, err = s.RunOnce(ctx, "k", "p", fn)
	}
	require.NoError(t, err)
	assert.Equal(t, "1", got)
}
