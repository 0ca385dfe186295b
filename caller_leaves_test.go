package idem

import (
	"context"
	"errors"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed094d4201/idem/backend"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// slowClaim is a backend over mem whose first Claim blocks until its ctx
// ends (a slow round trip), as a real client does when ctx is cancelled
// mid-query; later claims go straight through.
func slowClaim(mem backend.Backend, entered chan<- struct{}) backend.Backend {
	var calls atomic.Int32
	return hookedB{Backend: mem, claim: func(ctx context.Context, rec backend.Record, now time.Time, lease time.Duration) (backend.Record, bool, error) {
		if calls.Add(1) == 1 {
			close(entered)
			<-ctx.Done()
			return backend.Record{}, false, ctx.Err()
		}
		return mem.Claim(ctx, rec, now, lease)
	}}
}

type hookedB struct {
	backend.Backend
	claim func(ctx context.Context, rec backend.Record, now time.Time, lease time.Duration) (backend.Record, bool, error)
}

func (h hookedB) Claim(ctx context.Context, rec backend.Record, now time.Time, lease time.Duration) (backend.Record, bool, error) {
	return h.claim(ctx, rec, now, lease)
}

// The first caller's ctx ends during its backend claim round trip. A
// duplicate waiting on it in this process, whose own ctx is fine, must not
// fail because the first one left (DESIGN rule 4): it should claim afresh.
func TestOwnerLeavingDuringClaimSparesWaiters(t *testing.T) {
	mem := newStubBackend()
	entered := make(chan struct{})
	s := newStore[int](t, Options{Backend: slowClaim(mem, entered), SettleTimeout: 50 * time.Millisecond})
	parked := waitersParked(t, 1)
	short, cancel := context.WithCancel(context.Background())
	first := beginAsyncT(short, s, "k")
	<-entered
	patient := beginAsyncT(context.Background(), s, "k")
	<-parked
	cancel()
	o1 := <-first
	t.Logf("first caller (its ctx ended): %v", o1.err)
	o := <-patient
	require.NoError(t, o.err, "the patient caller got the first caller's claim failure")
	o.t.Release()
}

// The same through RunOnce: the patient caller's fn should run.
func TestOwnerLeavingDuringClaimSparesRunOnceWaiters(t *testing.T) {
	mem := newStubBackend()
	entered := make(chan struct{})
	s := newStore[int](t, Options{Backend: slowClaim(mem, entered), SettleTimeout: 50 * time.Millisecond})
	parked := waitersParked(t, 1)
	short, cancel := context.WithCancel(context.Background())
	fn := func(context.Context) (int, error) { return 7, nil }
	first := runAsync(short, s, "k", "p", fn)
	<-entered
	patient := runAsync(context.Background(), s, "k", "p", fn)
	<-parked
	cancel()
	o1 := <-first
	t.Logf("first caller (its ctx ended): %v", o1.err)
	o := <-patient
	require.NoError(t, o.err, "the patient caller, whose ctx never ends, got the first caller's claim failure")
	assert.Equal(t, 7, o.val)
}

// The first caller itself: its ctx ended during the claim; RunOnce's doc
// says such a caller gets an error matching ErrInProgress and ctx.Err()
// (or ctx.Err()); not a *BackendError, which idemhttp would map to 503 and,
// with FailOpen, answer by running the handler unguarded.
func TestOwnerLeavingDuringClaimIsInProgress(t *testing.T) {
	mem := newStubBackend()
	entered := make(chan struct{})
	s := newStore[int](t, Options{Backend: slowClaim(mem, entered), SettleTimeout: 50 * time.Millisecond})
	short, cancel := context.WithCancel(context.Background())
	first := beginAsyncT(short, s, "k")
	<-entered
	cancel()
	o := <-first
	var be *BackendError
	if errors.As(o.err, &be) {
		t.Errorf("a caller whose own ctx ended gets a *BackendError (op %q): %v", be.Op, o.err)
	}
	assert.ErrorIs(t, o.err, context.Canceled)
}

// The yield path: callers A and B share a ctx (as goroutines of one request
// do); A polls a key another store holds and B waits on A here; C, patient,
// waits too. When the shared ctx ends, A yields; B may wake to the yield
// rather than its own ctx and claim again with a dead ctx, and C, behind
// B, is then sent away with B's error.
func TestTicketYieldWithDeadCtx(t *testing.T) {
	var badB, badC int
	const rounds = 60
	for i := 0; i < rounds; i++ {
		mem := newStubBackend()
		other := New[int](Options{Backend: mem, SweepInterval: -1, SettleTimeout: 50 * time.Millisecond})
		held, err := other.Begin(context.Background(), "k", "p")
		require.NoError(t, err)
		s := New[int](Options{Backend: mem, SweepInterval: -1, SettleTimeout: 50 * time.Millisecond})
		parked := make(chan struct{}, 8)
		testHookWait = func() { parked <- struct{}{} }
		shared, cancel := context.WithCancel(context.Background())
		a := beginAsyncT(shared, s, "k")
		for !s.table.inFlight("k") {
			runtime.Gosched()
		}
		b := beginAsyncT(shared, s, "k")
		<-parked
		c := beginAsyncT(context.Background(), s, "k")
		<-parked
		cancel()
		<-a
		ob := <-b
		if ob.err != nil && !errors.Is(ob.err, ErrInProgress) {
			badB++
			if badB == 1 {
				t.Logf("B (ctx ended) got: %v", ob.err)
			}
		}
		if ob.err == nil {
			ob.t.Release()
		}
		held.Finish(5, nil)
		oc := <-c
		if oc.err != nil {
			badC++
			if badC == 1 {
				t.Logf("C (patient) got: %v", oc.err)
			}
		} else if !oc.t.Replayed() {
			oc.t.Release()
		}
		testHookWait = nil
		_ = s.Close()
		_ = other.Close()
	}
	if badB > 0 || badC > 0 {
		t.Errorf("of %d rounds: B got a non-ErrInProgress error %d times, patient C got an error %d times", rounds, badB, badC)
	}
}

func TestTicketCloseDuringYield(t *testing.T) {
	held := heldElsewhere{finished: make(chan struct{})}
	defer close(held.finished)
	s := New[int](Options{Backend: held, SweepInterval: -1})
	parked := waitersParked(t, 1)
	a := beginAsyncT(context.Background(), s, "k")
	for !s.table.inFlight("k") {
		runtime.Gosched()
	}
	b := beginAsyncT(context.Background(), s, "k")
	<-parked
	closed := make(chan struct{})
	go func() { _ = s.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Close hangs behind a poll")
	}
	oa, ob := <-a, <-b
	assert.ErrorIs(t, oa.err, ErrInProgress)
	assert.ErrorIs(t, ob.err, ErrClosed)
}
