package idem_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemtest"
	lc "github.com/seed094d4201/idem/internal/lifecycle"
)

// operatorGate is a Backend whose Forget and Get (Resolve's first read)
// call before first: the moment an operator's call has reached the
// Backend and changed nothing yet.
type operatorGate struct {
	backend.Backend
	before atomic.Pointer[func()]
}

func (g *operatorGate) hold() {
	if f := g.before.Swap(nil); f != nil {
		(*f)()
	}
}

func (g *operatorGate) Forget(ctx context.Context, key string, now time.Time) error {
	g.hold()
	return g.Backend.Forget(ctx, key, now)
}

func (g *operatorGate) Get(ctx context.Context, key string, now time.Time) (backend.Record, bool, error) {
	g.hold()
	return g.Backend.Get(ctx, key, now)
}

// callDuring starts a RunOnce of key while an operator's call is at the
// Backend (from gate's before) and reports whether it waited for the
// operator (true) or started its run at once (false). The run, if it
// starts, returns v once release is closed.
func callDuring(t *testing.T, s *idem.Store[int], runs *atomic.Int32, v int, release <-chan struct{}) (waited <-chan bool, result <-chan error) {
	w, res := make(chan bool, 1), make(chan error, 1)
	heard := make(chan struct{}, 1)
	stop := idem.HearMoves(func(key string, from lc.Phase, ev lc.Event, m lc.Move) {
		if from == lc.Reconciling && (ev == lc.Call || ev == lc.CallOther) {
			select {
			case heard <- struct{}{}:
			default:
			}
		}
	})
	entered := make(chan struct{})
	go func() {
		_, err := s.RunOnce(context.Background(), "k", "p", func(context.Context) (int, error) {
			runs.Add(1)
			close(entered)
			<-release
			return v, nil
		})
		res <- err
	}()
	select {
	case <-heard:
		w <- true
	case <-entered:
		w <- false
	case <-time.After(time.Minute): // neither: it waits for something else
		t.Error("the call neither waited for the operator nor ran")
		w <- false
	}
	stop()
	return w, res
}

// A call that arrives while an operator's Forget is at the Backend waits
// for it, then runs. Were it to claim the key there first, a Forget whose
// clock runs ahead would judge the fresh claim lapsed and delete it under
// its running owner; that owner's success was then told to callers, and
// the next call ran the key again (TestForgetDuringRunsRunsEachKeyOnce,
// about one run in 600 under load).
func TestCallDuringForgetWaitsForItThenRuns(t *testing.T) {
	// The clock Forget reads steps a minute ahead, and the call arrives
	// just before: after Forget has looked at memory, before it reaches
	// the Backend.
	var ahead atomic.Int64
	var before atomic.Pointer[func()]
	now := func() time.Time {
		if f := before.Swap(nil); f != nil {
			(*f)()
		}
		return time.Now().Add(time.Duration(ahead.Load()))
	}
	s := idem.New[int](idem.Options{Backend: idemtest.NewMemoryBackend(), Lease: 2 * time.Second,
		SweepInterval: -1, Now: now})
	defer closeWithin(t, s, 5*time.Second)
	var runs atomic.Int32
	release := make(chan struct{})
	var waited <-chan bool
	var result <-chan error
	step := func() {
		waited, result = callDuring(t, s, &runs, 1, release)
		ahead.Store(int64(time.Minute))
	}
	before.Store(&step)
	if err := s.Forget(context.Background(), "k"); err != nil {
		t.Errorf("Forget = %v, want nil", err)
	}
	close(release)
	if !<-waited {
		t.Error("a call during Forget started its run before Forget had answered")
	}
	if err := <-result; err != nil {
		t.Fatalf("the call during Forget = %v", err)
	}
	v, err := s.RunOnce(context.Background(), "k", "p", func(context.Context) (int, error) {
		runs.Add(1)
		return 2, nil
	})
	if v != 1 || err != nil || runs.Load() != 1 {
		t.Fatalf("the next call = %d, %v after %d runs; want the first run's 1, nil after 1 run", v, err, runs.Load())
	}
}

// A call that arrives while an operator's Resolve reads the key's record
// waits for it, then replays the outcome Resolve gave: it neither starts
// a claim that Resolve, its clock ahead, could take for the interrupted
// one, nor runs the operation the operator said took effect.
func TestCallDuringResolveWaitsForItThenReplays(t *testing.T) {
	mem := idemtest.NewMemoryBackend()
	// An interrupted claim: a lease that lapsed long ago, its owner gone.
	past := time.Now().Add(-time.Hour)
	if _, _, err := mem.Claim(context.Background(), backend.Record{Key: "k", Fingerprint: mustFingerprint(t, "p"), Token: "dead", State: backend.StatePending}, past, time.Second); err != nil {
		t.Fatal(err)
	}
	gate := &operatorGate{Backend: mem}
	s := idem.New[int](idem.Options{Backend: gate, Lease: 2 * time.Second, SweepInterval: -1})
	defer closeWithin(t, s, 5*time.Second)
	var runs atomic.Int32
	release := make(chan struct{})
	close(release)
	var waited <-chan bool
	var result <-chan error
	before := func() { waited, result = callDuring(t, s, &runs, 1, release) }
	gate.before.Store(&before)
	if err := s.Resolve(context.Background(), "k", 7, nil); err != nil {
		t.Fatalf("Resolve = %v, want nil", err)
	}
	if !<-waited {
		t.Error("a call during Resolve started its run before Resolve had answered")
	}
	if err := <-result; err != nil {
		t.Fatalf("the call during Resolve = %v", err)
	}
	v, err := s.RunOnce(context.Background(), "k", "p", func(context.Context) (int, error) { runs.Add(1); return 2, nil })
	if v != 7 || err != nil || runs.Load() != 0 {
		t.Fatalf("a call after Resolve = %d, %v after %d runs; want Resolve's 7, nil and no run", v, err, runs.Load())
	}
}

// A call during Forget waits for it whatever its payload's fingerprint,
// the zero one (an Options.Fingerprint that ignores payloads) included: a
// mark has no payload for it to match or not.
func TestCallDuringForgetWaitsWhateverItsFingerprint(t *testing.T) {
	strays, _ := lc.Strays()
	gate := &operatorGate{Backend: idemtest.NewMemoryBackend()}
	s := idem.New[int](idem.Options{Backend: gate, SweepInterval: -1,
		Fingerprint: func(any) (idem.Fingerprint, error) { return idem.Fingerprint{}, nil }})
	defer closeWithin(t, s, 5*time.Second)
	var runs atomic.Int32
	release := make(chan struct{})
	close(release)
	var waited <-chan bool
	var result <-chan error
	before := func() { waited, result = callDuring(t, s, &runs, 1, release) }
	gate.before.Store(&before)
	if err := s.Forget(context.Background(), "k"); err != nil {
		t.Fatalf("Forget = %v, want nil", err)
	}
	if !<-waited {
		t.Error("a call during Forget started its run before Forget had answered")
	}
	if err := <-result; err != nil || runs.Load() != 1 {
		t.Errorf("the call during Forget = %v after %d runs, want nil after 1", err, runs.Load())
	}
	if n, last := lc.Strays(); n > strays {
		t.Errorf("the store asked the lifecycle for %d moves it lacks (the last: %s)", n-strays, last)
	}
}

// Close ends a call that waits for a Forget whose Backend call does not
// return: the call answers ErrInProgress and ErrClosed at once, as one
// waiting for another owner does, and the Forget still ends as its
// Backend answers.
func TestCloseEndsACallWaitingForForget(t *testing.T) {
	gate := &operatorGate{Backend: idemtest.NewMemoryBackend()}
	s := idem.New[int](idem.Options{Backend: gate, SweepInterval: -1})
	var runs atomic.Int32
	unstick, never := make(chan struct{}), make(chan struct{})
	called := make(chan (<-chan error), 1)
	before := func() {
		waited, result := callDuring(t, s, &runs, 1, never)
		if !<-waited {
			t.Error("a call during Forget started its run before Forget had answered")
		}
		called <- result
		<-unstick // the Backend's Forget does not answer
	}
	gate.before.Store(&before)
	forgot := make(chan error, 1)
	go func() { forgot <- s.Forget(context.Background(), "k") }()
	result := <-called
	closeWithin(t, s, 5*time.Second)
	defer close(unstick)
	select {
	case err := <-result:
		if !errors.Is(err, idem.ErrInProgress) || !errors.Is(err, idem.ErrClosed) {
			t.Errorf("the waiting call after Close = %v, want ErrInProgress and ErrClosed", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the call still waits for the Forget a minute after Close")
	}
	unstick <- struct{}{}
	if err := <-forgot; err != nil {
		t.Errorf("Forget = %v, want nil", err)
	}
	if runs.Load() != 0 {
		t.Errorf("%d runs after Close", runs.Load())
	}
}
