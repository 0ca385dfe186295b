package idem

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/seed094d4201/idem/backend"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// begin calls s.Begin and requires that the caller owns the key.
func begin(t *testing.T, s *Store[int], key string) *Ticket[int] {
	t.Helper()
	tk, err := s.Begin(context.Background(), key, "p")
	require.NoError(t, err)
	replayed := tk.Replayed()
	require.False(t, replayed, "the key was expected to be free")
	return tk
}

// beginAsync calls s.Begin in a new goroutine and delivers what it got: the
// replayed outcome, or Begin's error.
func beginAsync(ctx context.Context, s *Store[int], key string) <-chan outcome[int] {
	ch := make(chan outcome[int], 1)
	go func() {
		tk, err := s.Begin(ctx, key, "p")
		if err != nil {
			ch <- outcome[int]{0, err}
			return
		}
		ok := tk.Replayed()
		v, err := tk.Result()
		if !ok {
			tk.Release()
			err = errors.New("Begin claimed a key in flight")
		}
		ch <- outcome[int]{v, err}
	}()
	return ch
}

func TestTicketFinishRecordsAndReplays(t *testing.T) {
	s := newStore[int](t, Options{})
	tk := begin(t, s, "k")
	parked := waitersParked(t, 1)
	dup := beginAsync(context.Background(), s, "k")
	<-parked
	v, err := tk.Finish(7, nil)
	require.NoError(t, err)
	assert.Equal(t, 7, v)

	o := <-dup
	require.NoError(t, o.err, "the duplicate waited and replays")
	assert.Equal(t, 7, o.val)

	again, err := s.Begin(context.Background(), "k", "p")
	require.NoError(t, err)
	ok := again.Replayed()
	v, err = again.Result()
	assert.True(t, ok)
	assert.NoError(t, err)
	assert.Equal(t, 7, v)
	v, err = s.RunOnce(context.Background(), "k", "p", func(context.Context) (int, error) { return 0, errors.New("ran again") })
	assert.NoError(t, err)
	assert.Equal(t, 7, v, "RunOnce replays what Finish recorded")

	// Finish and Release after Finish change nothing.
	v, err = tk.Finish(8, errors.New("late"))
	assert.NoError(t, err)
	assert.Equal(t, 7, v)
	tk.Release()
	v, _ = s.RunOnce(context.Background(), "k", "p", ranAgain)
	assert.Equal(t, 7, v)
}

func ranAgain(context.Context) (int, error) { return 0, errors.New("fn ran") }

func TestTicketTransientErrorReleases(t *testing.T) {
	s := newStore[int](t, Options{})
	tk := begin(t, s, "k")
	parked := waitersParked(t, 1)
	dup := beginAsync(context.Background(), s, "k")
	<-parked
	boom := errors.New("timeout talking to the bank")
	_, err := tk.Finish(0, boom)
	assert.ErrorIs(t, err, boom)
	assert.ErrorIs(t, (<-dup).err, boom, "a duplicate that waited gets the failure as Begin's error")
	begin(t, s, "k").Release() // the key is free again
}

func TestTicketFinalErrorIsRemembered(t *testing.T) {
	s := newStore[int](t, Options{})
	declined := Final(errors.New("card declined"))
	_, err := begin(t, s, "k").Finish(0, declined)
	assert.ErrorIs(t, err, declined)
	tk, err := s.Begin(context.Background(), "k", "p")
	require.NoError(t, err)
	ok := tk.Replayed()
	_, err = tk.Result()
	assert.True(t, ok)
	assert.True(t, IsFinal(err))
}

// A deferred Release during a panic between Begin and Finish releases the
// key and lets the panic go on, the same whether it is deferred directly
// or inside a closure (it recovers nothing, so the form cannot matter):
// the waiters are told the operation was released, and the key runs again.
func TestTicketReleaseDuringAPanic(t *testing.T) {
	for name, deferRelease := range map[string]func(tk *Ticket[int]){
		"direct": func(tk *Ticket[int]) {
			defer tk.Release()
			panic("card reader on fire")
		},
		"closure": func(tk *Ticket[int]) {
			defer func() { tk.Release() }()
			panic("card reader on fire")
		},
	} {
		t.Run(name, func(t *testing.T) {
			s := newStore[int](t, Options{})
			tk := begin(t, s, "k")
			parked := waitersParked(t, 1)
			dup := beginAsync(context.Background(), s, "k")
			<-parked
			recovered := func() (v any) {
				defer func() { v = recover() }()
				deferRelease(tk)
				return nil
			}()
			assert.Equal(t, "card reader on fire", recovered, "the panic goes on up the caller's stack")
			require.ErrorIs(t, (<-dup).err, errReleased)
			again := begin(t, s, "k")
			assert.False(t, again.Replayed(), "released: the key runs again")
			again.Release()
		})
	}
}

func TestTicketReleaseWithoutFinish(t *testing.T) {
	s := newStore[int](t, Options{})
	tk := begin(t, s, "k")
	parked := waitersParked(t, 1)
	dup := beginAsync(context.Background(), s, "k")
	<-parked
	tk.Release()
	assert.ErrorIs(t, (<-dup).err, errReleased)
	v, err := s.RunOnce(context.Background(), "k", "p", func(context.Context) (int, error) { return 3, nil })
	require.NoError(t, err)
	assert.Equal(t, 3, v, "a released key runs again")
}

// A ticket dropped without Finish or Release does not hold its key for
// ever: the garbage collector finds it and the key is released.
func TestAbandonedTicketIsReleased(t *testing.T) {
	s := New[int](Options{}) // not closed on failure: Close would wait for the key
	defer func() {
		if !t.Failed() {
			_ = s.Close()
		}
	}()
	func() {
		_, err := s.Begin(context.Background(), "k", "p")
		require.NoError(t, err)
	}()
	deadline := time.Now().Add(10 * time.Second)
	for s.table.inFlight("k") {
		require.True(t, time.Now().Before(deadline), "the abandoned ticket's key is still held")
		runtime.GC()
		runtime.Gosched()
	}
	begin(t, s, "k").Release()
}

func TestTicketContext(t *testing.T) {
	type ctxKey struct{}
	s := newStore[int](t, Options{ExecutionTimeout: time.Hour})
	ctx, cancel := context.WithCancel(context.WithValue(context.Background(), ctxKey{}, "v"))
	tk, err := s.Begin(ctx, "k", "p")
	require.NoError(t, err)
	work := tk.Context()
	cancel()
	assert.Equal(t, "v", work.Value(ctxKey{}), "the work keeps Begin's values")
	assert.NoError(t, work.Err(), "the caller's cancellation does not end the work")
	_, hasDeadline := work.Deadline()
	assert.True(t, hasDeadline, "ExecutionTimeout bounds the work")
	tk.Finish(1, nil)
	assert.Error(t, work.Err(), "the work's context ends with the ticket")

	s = newStore[int](t, Options{ExecutionTimeout: time.Millisecond})
	tk = begin(t, s, "k")
	<-tk.Context().Done()
	assert.ErrorIs(t, tk.Context().Err(), context.DeadlineExceeded)
	tk.Release()
}

func TestBeginBadInput(t *testing.T) {
	s := newStore[int](t, Options{})
	//lint:ignore SA1012 a nil Context is the bad input under test
	_, err := s.Begin(nil, "k", "p") //nolint:staticcheck
	assert.ErrorIs(t, err, errNilContext)
	_, err = s.Begin(context.Background(), "", "p")
	assert.ErrorIs(t, err, ErrInvalidKey)
	_, err = s.Begin(context.Background(), "k", make(chan int))
	assert.Error(t, err, "a payload with no fingerprint")
	done, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = s.Begin(done, "k", "p")
	assert.ErrorIs(t, err, context.Canceled, "a done ctx claims nothing")
	begin(t, s, "k").Release()

	tk := begin(t, s, "k")
	_, err = tk.Do(nil)
	assert.ErrorIs(t, err, errNilFunc)
	require.NoError(t, s.Close())
	_, err = s.Begin(context.Background(), "k", "p")
	assert.ErrorIs(t, err, ErrClosed)
}

// Close waits for an open ticket, as for an execution in flight.
func TestCloseWaitsForAnOpenTicket(t *testing.T) {
	s := New[int](Options{})
	tk := begin(t, s, "k")
	closed := make(chan struct{})
	go func() { _ = s.Close(); close(closed) }()
	select {
	case <-closed:
		t.Fatal("Close returned while a ticket was open")
	case <-time.After(20 * time.Millisecond):
	}
	tk.Finish(1, nil)
	<-closed
}

func TestTicketDoRecoversAPanic(t *testing.T) {
	s := newStore[int](t, Options{})
	_, err := begin(t, s, "k").Do(func(context.Context) (int, error) { panic(Final(errors.New("declined"))) })
	var pe *PanicError
	require.ErrorAs(t, err, &pe)
	begin(t, s, "k").Release() // a panic is never remembered, whatever its value
}

// heldElsewhere is a Backend whose every key is in flight through another
// store until finished is closed, then completed with the value 5.
type heldElsewhere struct {
	finished chan struct{}
}

func (h heldElsewhere) record(key string, fp [32]byte) backend.Record {
	select {
	case <-h.finished:
		return backend.Record{Key: key, Fingerprint: fp, Token: "other", State: backend.StateCompleted, Value: []byte("5")}
	default:
		return backend.Record{Key: key, Fingerprint: fp, Token: "other", State: backend.StatePending}
	}
}

func (h heldElsewhere) Claim(_ context.Context, rec backend.Record, _ time.Time, _ time.Duration) (backend.Record, bool, error) {
	return h.record(rec.Key, rec.Fingerprint), false, nil
}

func (h heldElsewhere) Get(_ context.Context, key string, _ time.Time) (backend.Record, bool, error) {
	fp, _ := DefaultFingerprint("p")
	return h.record(key, fp), true, nil
}

func (heldElsewhere) Complete(context.Context, backend.Record, time.Time, time.Duration) error {
	return backend.ErrNotOwner
}
func (heldElsewhere) Release(context.Context, string, string) error { return backend.ErrNotOwner }
func (heldElsewhere) Renew(context.Context, string, string, time.Time, time.Duration) error {
	return backend.ErrNotOwner
}
func (heldElsewhere) Forget(context.Context, string, time.Time) error    { return nil }
func (heldElsewhere) Sweep(context.Context, time.Time, int) (int, error) { return 0, nil }

// A caller waiting here behind one that polls another store's claim is
// not sent away when that one's ctx ends: it polls on under its own.
func TestWaiterOutlivesAPollerThatGivesUp(t *testing.T) {
	held := heldElsewhere{finished: make(chan struct{})}
	s := newStore[int](t, Options{Backend: held})
	parked := waitersParked(t, 1)
	short, cancel := context.WithCancel(context.Background())
	first := beginAsync(short, s, "k")
	var patient <-chan outcome[int]
	for patient == nil { // once the first caller polls, the second waits on it
		if s.table.inFlight("k") {
			patient = beginAsync(context.Background(), s, "k")
		}
		runtime.Gosched()
	}
	<-parked
	cancel()
	assert.ErrorIs(t, (<-first).err, ErrInProgress, "the first caller's ctx ended")
	select {
	case o := <-patient:
		t.Fatalf("the patient caller was sent away with the first one's error: %v", o.err)
	default:
	}
	close(held.finished)
	o := <-patient
	require.NoError(t, o.err)
	assert.Equal(t, 5, o.val, "the patient caller replays the other store's outcome")
}
