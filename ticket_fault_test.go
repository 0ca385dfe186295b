package idem

// The two-phase API (Begin / Ticket) under faults: callers that leave at
// every point of a claim, dropped tickets, a Codec that panics.

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"sync"

	"github.com/seed094d4201/idem/backend"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// keyReleasedByGC drops nothing itself: it runs the GC until key is no longer
// in flight in s, or gives up after d.
func keyReleasedByGC(s *Store[int], key string, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for s.table.inFlight(key) {
		if time.Now().After(deadline) {
			return false
		}
		runtime.GC()
		runtime.Gosched()
		time.Sleep(time.Millisecond)
	}
	return true
}

// A ticket begun with a cancellable ctx (every HTTP request's, every
// consumer's) whose Context was asked for, then dropped: the finalizer must
// release its key, as the Ticket doc promises.
func TestAbandonedTicketWithTimeoutIsReleased(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts Options
		loc  bool
	}{
		{"Begin", Options{SweepInterval: -1}, false},
		{"Begin+ExecutionTimeout", Options{SweepInterval: -1, ExecutionTimeout: time.Hour}, false},
		{"Begin+ExecutionTimeout100ms", Options{SweepInterval: -1, ExecutionTimeout: 100 * time.Millisecond}, false},
		{"BeginLocal", Options{SweepInterval: -1}, true},
		{"BeginLocal+ExecutionTimeout", Options{SweepInterval: -1, ExecutionTimeout: time.Hour}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := New[int](tc.opts) // not closed on failure: Close would wait for the key for ever
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			func() {
				var tk *Ticket[int]
				var err error
				if tc.loc {
					tk, err = s.beginLocal(ctx, "k", "p")
				} else {
					tk, err = s.Begin(ctx, "k", "p")
				}
				require.NoError(t, err)
				_ = tk.Context() // the work starts... and the caller forgets Finish
			}()
			if !keyReleasedByGC(s, "k", 10*time.Second) {
				t.Fatal("the abandoned ticket's key is still held after 10s of GCs: stranded for ever, and Close would hang")
			}
			_ = s.Close()
		})
	}
}

// Control: the same without calling Context is released (the existing test).
func TestAbandonedTicketWithoutContextIsReleased(t *testing.T) {
	s := New[int](Options{SweepInterval: -1})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	func() {
		_, err := s.Begin(ctx, "k", "p")
		require.NoError(t, err)
	}()
	require.True(t, keyReleasedByGC(s, "k", 10*time.Second))
	_ = s.Close()
}

// Control: an abandoned durable ticket whose Context was used.
func TestTicketAbandonedDurableTicketIsReleased(t *testing.T) {
	mem := newStubBackend()
	s := New[int](Options{SweepInterval: -1, Backend: mem})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	func() {
		tk, err := s.Begin(ctx, "k", "p")
		require.NoError(t, err)
		_ = tk.Context()
	}()
	require.True(t, keyReleasedByGC(s, "k", 10*time.Second))
	_ = s.Close()
}

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
// (or ctx.Err()); it gets a *BackendError, which idemhttp maps to 503 and,
// with FailOpen, runs the handler unguarded.
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

// Context is documented to end when the ticket is finished. Asked for only
// after Finish (no Backend), it is a live context, with a timer that nothing
// stops.
func TestTicketContextAfterFinishIsDone(t *testing.T) {
	s := newStore[int](t, Options{ExecutionTimeout: time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tk, err := s.Begin(ctx, "k", "p")
	require.NoError(t, err)
	tk.Finish(1, nil)
	assert.Error(t, tk.Context().Err(), "Context after Finish should be done")
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

// A Codec that panics in Finish (a MarshalJSON that panics): the key must
// not be stranded if the caller recovers (as net/http does for a handler).
type panicCodec struct{}

func (panicCodec) Marshal(any) ([]byte, error)        { panic("marshal boom") }
func (panicCodec) Unmarshal(data []byte, v any) error { return nil }

func TestCodecPanicInFinishReleasesKey(t *testing.T) {
	mem := newStubBackend()
	s := New[int](Options{Backend: mem, Codec: panicCodec{}, SweepInterval: -1})
	func() {
		defer func() { _ = recover() }()
		tk, err := s.Begin(context.Background(), "k", "p")
		require.NoError(t, err)
		defer tk.Release()
		tk.Finish(1, nil)
	}()
	if s.table.inFlight("k") {
		closed := make(chan struct{})
		go func() { _ = s.Close(); close(closed) }()
		select {
		case <-closed:
		case <-time.After(500 * time.Millisecond):
			t.Error("Close hangs")
		}
		t.Fatal("a panic in Finish (Codec) left the key in flight in memory for ever: waiters hang, Close hangs")
	}
	_ = s.Close()
}

// stubBackend is a minimal in-memory Backend for this file (package idem
// cannot import idemtest). Like real clients, every call fails once its ctx
// is done. No leases.
type stubBackend struct {
	mu   sync.Mutex
	recs map[string]backend.Record
}

func newStubBackend() *stubBackend { return &stubBackend{recs: map[string]backend.Record{}} }

func (m *stubBackend) Claim(ctx context.Context, rec backend.Record, now time.Time, lease time.Duration) (backend.Record, bool, error) {
	if err := ctx.Err(); err != nil {
		return backend.Record{}, false, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if old, ok := m.recs[rec.Key]; ok {
		return old, false, nil
	}
	rec.State = backend.StatePending
	m.recs[rec.Key] = rec
	return rec, true, nil
}

func (m *stubBackend) Complete(ctx context.Context, rec backend.Record, now time.Time, ttl time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if old, ok := m.recs[rec.Key]; !ok || old.Token != rec.Token || old.State != backend.StatePending {
		return backend.ErrNotOwner
	}
	rec.State = backend.StateCompleted
	m.recs[rec.Key] = rec
	return nil
}

func (m *stubBackend) Release(ctx context.Context, key, token string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if old, ok := m.recs[key]; !ok || old.Token != token || old.State != backend.StatePending {
		return backend.ErrNotOwner
	}
	delete(m.recs, key)
	return nil
}

func (m *stubBackend) Get(ctx context.Context, key string, now time.Time) (backend.Record, bool, error) {
	if err := ctx.Err(); err != nil {
		return backend.Record{}, false, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.recs[key]
	return r, ok, nil
}

func (m *stubBackend) Renew(ctx context.Context, key, token string, now time.Time, lease time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if old, ok := m.recs[key]; !ok || old.Token != token || old.State != backend.StatePending {
		return backend.ErrNotOwner
	}
	return nil
}

func (m *stubBackend) Forget(context.Context, string, time.Time) error    { return nil }
func (m *stubBackend) Sweep(context.Context, time.Time, int) (int, error) { return 0, nil }

// ticketOutcome is what one Begin got: its ticket or its error.
type ticketOutcome struct {
	t   *Ticket[int]
	err error
}

func beginAsyncT(ctx context.Context, s *Store[int], key string) <-chan ticketOutcome {
	ch := make(chan ticketOutcome, 1)
	go func() {
		tk, err := s.Begin(ctx, key, "p")
		ch <- ticketOutcome{tk, err}
	}()
	return ch
}

// ---- attacks that held ----

func TestTicketFinishTwiceReleaseAfterFinishOtherGoroutine(t *testing.T) {
	s := newStore[int](t, Options{Backend: newStubBackend()})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tk, err := s.Begin(ctx, "k", "p")
	require.NoError(t, err)
	w := beginAsyncT(context.Background(), s, "k")
	done := make(chan struct{})
	go func() { // Finish on another goroutine than Begin's
		defer close(done)
		v, err := tk.Finish(3, nil)
		assert.NoError(t, err)
		assert.Equal(t, 3, v)
	}()
	<-done
	v, err := tk.Finish(4, errors.New("late"))
	assert.NoError(t, err)
	assert.Equal(t, 3, v, "a second Finish changes nothing")
	tk.Release() // no-op
	o := <-w
	require.NoError(t, o.err)
	ok := o.t.Replayed()
	v, err = o.t.Result()
	assert.True(t, ok)
	assert.NoError(t, err)
	assert.Equal(t, 3, v)
	tk2, err := s.Begin(context.Background(), "k", "p")
	require.NoError(t, err)
	ok = tk2.Replayed()
	v, _ = tk2.Result()
	assert.True(t, ok)
	assert.Equal(t, 3, v)
}

func TestTicketPanicFinalWithDeferredRelease(t *testing.T) {
	s := newStore[int](t, Options{Backend: newStubBackend()})
	tk, err := s.Begin(context.Background(), "k", "p")
	require.NoError(t, err)
	parked := waitersParked(t, 1)
	w := beginAsyncT(context.Background(), s, "k")
	<-parked
	var got any
	func() {
		defer func() { got = recover() }()
		defer tk.Release()
		panic(Final(errors.New("declined")))
	}()
	assert.True(t, IsFinal(got.(error)), "the panic goes on up with its value")
	o := <-w
	require.ErrorIs(t, o.err, errReleased, "the waiter is told the key was released")
	assert.False(t, IsFinal(o.err))
	tk2, err := s.Begin(context.Background(), "k", "p")
	require.NoError(t, err)
	ok := tk2.Replayed()
	assert.False(t, ok, "a panic, even of a Final error, is not remembered")
	tk2.Release()
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

func TestTicketDurableExecutionTimeout(t *testing.T) {
	s := newStore[int](t, Options{Backend: newStubBackend(), ExecutionTimeout: 20 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	tk, err := s.Begin(ctx, "k", "p")
	require.NoError(t, err)
	cancel()
	// Not NoError: on a slow machine the 20 ms timeout may already have run out.
	assert.NotErrorIs(t, tk.Context().Err(), context.Canceled, "Begin's cancellation does not end the work")
	<-tk.Context().Done()
	assert.ErrorIs(t, tk.Context().Err(), context.DeadlineExceeded)
	_, err = tk.Finish(0, tk.Context().Err())
	assert.Error(t, err)
	tk2, err := s.Begin(context.Background(), "k", "p")
	require.NoError(t, err)
	tk2.Release()
}

// A Codec that returns an error: the success is answered, and the Observer
// is told of a *NotRecordedError that names the Codec and wraps its error,
// so that an operator (and the model suite) can tell an outcome that cannot
// be encoded, which is held until the store closes, from a backend write
// that will be retried.
type errCodec struct{ err error }

func (c errCodec) Marshal(any) ([]byte, error)      { return nil, c.err }
func (errCodec) Unmarshal(data []byte, v any) error { return nil }

func TestCodecErrorIsNamedInNotRecorded(t *testing.T) {
	cause := errors.New("json: unsupported type: chan int")
	var told error
	var logged bytes.Buffer
	s := New[int](Options{Backend: newStubBackend(), Codec: errCodec{cause}, SweepInterval: -1, Observer: &Observer{
		NotRecorded: func(_ context.Context, _ string, err error) { told = err },
	}, Logger: slog.New(slog.NewTextHandler(&logged, nil))})
	defer s.Close()
	v, err := s.RunOnce(context.Background(), "k", "p", func(context.Context) (int, error) { return 7, nil })
	require.NoError(t, err)
	require.Equal(t, 7, v)
	var nr *NotRecordedError
	require.ErrorAs(t, told, &nr)
	require.ErrorIs(t, told, cause)
	require.Contains(t, told.Error(), "the Codec could not encode the outcome")
	assert.Contains(t, logged.String(), "level=ERROR msg=\"idem: outcome not recorded\" key=k", "the store logs it, since it returns no error")
}
