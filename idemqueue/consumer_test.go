package idemqueue

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Every row of the package doc's table, through a real Store over a
// durable (in-memory) backend.

func consumer(t *testing.T, b backend.Backend, opts Options) *Consumer[int] {
	t.Helper()
	s := idem.New[int](idem.Options{Backend: b})
	t.Cleanup(func() { s.Close() })
	c, err := New(s, opts)
	require.NoError(t, err)
	return c
}

func TestNewRefusesANilStore(t *testing.T) {
	_, err := New[int](nil, Options{})
	assert.Error(t, err)
}

func TestDoneAndReplayedAreAcked(t *testing.T) {
	c := consumer(t, idemtest.NewMemoryBackend(), Options{})
	ctx := context.Background()
	var runs atomic.Int32
	fn := func(context.Context) (int, error) { runs.Add(1); return 7, nil }
	assert.Equal(t, Decision{Action: Ack}, c.Handle(ctx, "m1", "body", fn))
	assert.Equal(t, Decision{Action: Ack, Replayed: true}, c.Handle(ctx, "m1", "body", fn), "a redelivery")
	assert.Equal(t, int32(1), runs.Load())
}

func TestFinalFailureIsRejectedAndReplayedRejected(t *testing.T) {
	c := consumer(t, idemtest.NewMemoryBackend(), Options{})
	ctx := context.Background()
	declined := errors.New("card declined")
	var runs atomic.Int32
	fn := func(context.Context) (int, error) { runs.Add(1); return 0, idem.Final(declined) }
	d := c.Handle(ctx, "m1", "body", fn)
	assert.Equal(t, Reject, d.Action)
	assert.False(t, d.Replayed)
	assert.ErrorIs(t, d.Err, declined)
	d = c.Handle(ctx, "m1", "body", fn)
	assert.Equal(t, Reject, d.Action)
	assert.True(t, d.Replayed)
	assert.Equal(t, int32(1), runs.Load())
}

func TestOtherPayloadIsRejected(t *testing.T) {
	c := consumer(t, idemtest.NewMemoryBackend(), Options{})
	ctx := context.Background()
	ok := func(context.Context) (int, error) { return 1, nil }
	require.Equal(t, Ack, c.Handle(ctx, "m1", "body", ok).Action)
	d := c.Handle(ctx, "m1", "another body", ok)
	assert.Equal(t, Reject, d.Action)
	assert.ErrorIs(t, d.Err, idem.ErrPayloadMismatch)
}

func TestFailureIsRetriedLaterAndRunsAgain(t *testing.T) {
	c := consumer(t, idemtest.NewMemoryBackend(), Options{RetryDelay: 3 * time.Second})
	ctx := context.Background()
	boom := errors.New("upstream down")
	d := c.Handle(ctx, "m1", "body", func(context.Context) (int, error) { return 0, boom })
	assert.Equal(t, Decision{Action: Retry, Delay: 3 * time.Second, Err: d.Err}, d)
	assert.ErrorIs(t, d.Err, boom)
	d = c.Handle(ctx, "m1", "body", func(context.Context) (int, error) { panic("bug") })
	assert.Equal(t, Retry, d.Action, "a panic")
	var panicked *idem.PanicError
	assert.ErrorAs(t, d.Err, &panicked)
	assert.Equal(t, Decision{Action: Ack}, c.Handle(ctx, "m1", "body", func(context.Context) (int, error) { return 1, nil }), "the key was released")
}

func TestAnotherDeliveryRunningIsRetriedAfterBusyDelay(t *testing.T) {
	b := idemtest.NewMemoryBackend()
	c := consumer(t, b, Options{BusyDelay: 5 * time.Second})
	other := consumer(t, b, Options{}) // another process over the same records
	ctx := context.Background()
	started, release := make(chan struct{}), make(chan struct{})
	first := make(chan Decision, 1)
	go func() {
		first <- c.Handle(ctx, "m1", "body", func(context.Context) (int, error) { close(started); <-release; return 1, nil })
	}()
	<-started
	for _, cons := range []*Consumer[int]{c, other} {
		short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		d := cons.Handle(short, "m1", "body", func(context.Context) (int, error) { t.Error("ran twice"); return 0, nil })
		cancel()
		assert.Equal(t, Retry, d.Action)
		assert.ErrorIs(t, d.Err, idem.ErrInProgress)
	}
	close(release)
	assert.Equal(t, Ack, (<-first).Action)
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	d := c.Handle(short, "m1", "body", nil)
	assert.Equal(t, time.Duration(0), d.Delay)
	assert.Equal(t, Ack, d.Action)
}

func TestBusyDelayIsRetryDelayByDefault(t *testing.T) {
	c := consumer(t, idemtest.NewMemoryBackend(), Options{RetryDelay: 2 * time.Second})
	d := c.Decide(context.Background(), "m1", idem.ErrInProgress)
	assert.Equal(t, 2*time.Second, d.Delay)
}

// failing is a backend whose claims fail: the store cannot answer.
type failing struct{ *idemtest.MemoryBackend }

var errDown = errors.New("backend down")

func (failing) Claim(context.Context, backend.Record, time.Time, time.Duration) (backend.Record, bool, error) {
	return backend.Record{}, false, errDown
}

func TestStoreThatCannotAnswerIsRetried(t *testing.T) {
	s := idem.New[int](idem.Options{Backend: failing{idemtest.NewMemoryBackend()}, SettleTimeout: 50 * time.Millisecond})
	defer s.Close()
	c, err := New(s, Options{})
	require.NoError(t, err)
	d := c.Handle(context.Background(), "m1", "body", func(context.Context) (int, error) { t.Error("ran"); return 0, nil })
	assert.Equal(t, Retry, d.Action)
	assert.Equal(t, time.Second, d.Delay)
	var be *idem.BackendError
	assert.ErrorAs(t, d.Err, &be)

	closed := consumer(t, idemtest.NewMemoryBackend(), Options{})
	require.NoError(t, closed.Store().Close())
	d = closed.Handle(context.Background(), "m1", "body", func(context.Context) (int, error) { return 0, nil })
	assert.Equal(t, Retry, d.Action, "a consumer shutting down")
	assert.ErrorIs(t, d.Err, idem.ErrClosed)
}

// unrecorded is a backend whose Completes fail: a handler runs, and its
// outcome is not recorded.
type unrecorded struct{ *idemtest.MemoryBackend }

func (unrecorded) Complete(context.Context, backend.Record, time.Time, time.Duration) error {
	return errDown
}

func TestUnrecordedOutcomeIsAcked(t *testing.T) {
	s := idem.New[int](idem.Options{Backend: unrecorded{idemtest.NewMemoryBackend()}, SettleTimeout: 50 * time.Millisecond})
	defer s.Close()
	c, err := New(s, Options{})
	require.NoError(t, err)
	var runs atomic.Int32
	fn := func(context.Context) (int, error) { runs.Add(1); return 1, nil }
	assert.Equal(t, Ack, c.Handle(context.Background(), "m1", "body", fn).Action, "the effect happened")
	assert.Equal(t, Ack, c.Handle(context.Background(), "m1", "body", fn).Action, "replayed from memory")
	assert.Equal(t, int32(1), runs.Load())
}

// interrupted leaves key interrupted in b: claimed by a process that
// stopped in its handler.
func interrupted(t *testing.T, b *idemtest.MemoryBackend, key string) {
	t.Helper()
	dead := idem.New[int](idem.Options{Backend: b})
	tk, err := dead.Begin(context.Background(), key, "body")
	require.NoError(t, err)
	require.False(t, tk.Replayed())
	b.Crash()
	t.Cleanup(func() { tk.Release(); dead.Close() })
}

func TestInterruptedIsKeptAndRetriedByDefault(t *testing.T) {
	b := idemtest.NewMemoryBackend()
	interrupted(t, b, "m1")
	c := consumer(t, b, Options{})
	d := c.Handle(context.Background(), "m1", "body", func(context.Context) (int, error) { t.Error("ran"); return 0, nil })
	assert.Equal(t, Retry, d.Action)
	assert.Equal(t, time.Minute, d.Delay)
	assert.ErrorIs(t, d.Err, idem.ErrOutcomeUnknown)
}

func TestInterruptedGoesToReconcile(t *testing.T) {
	b := idemtest.NewMemoryBackend()
	interrupted(t, b, "m1")
	var c *Consumer[int]
	c = consumer(t, b, Options{Reconcile: func(ctx context.Context, key string, err error) Decision {
		assert.ErrorIs(t, err, idem.ErrOutcomeUnknown)
		// The effect's target says it happened, with 9: record that.
		if err := c.Store().Resolve(ctx, key, 9, nil); err != nil {
			return Decision{Action: Retry, Delay: time.Second, Err: err}
		}
		return Decision{Action: Retry} // at once: the redelivery replays
	}})
	var runs atomic.Int32
	fn := func(context.Context) (int, error) { runs.Add(1); return 1, nil }
	d := c.Handle(context.Background(), "m1", "body", fn)
	assert.Equal(t, Decision{Action: Retry}, d)
	assert.Equal(t, Decision{Action: Ack, Replayed: true}, c.Handle(context.Background(), "m1", "body", fn))
	assert.Zero(t, runs.Load())
}

func TestMisbehavingReconcileKeepsTheKey(t *testing.T) {
	b := idemtest.NewMemoryBackend()
	interrupted(t, b, "m1")
	for name, reconcile := range map[string]func(context.Context, string, error) Decision{
		"panics":         func(context.Context, string, error) Decision { panic("bug") },
		"no action":      func(context.Context, string, error) Decision { return Decision{} },
		"negative delay": func(context.Context, string, error) Decision { return Decision{Action: Retry, Delay: -time.Hour} },
		"ack with delay": func(context.Context, string, error) Decision { return Decision{Action: Ack, Delay: time.Hour} },
	} {
		c := consumer(t, b, Options{Reconcile: reconcile, InterruptedDelay: 7 * time.Second})
		d := c.Handle(context.Background(), "m1", "body", nil)
		switch name {
		case "negative delay":
			assert.Equal(t, Decision{Action: Retry}, d, name)
		case "ack with delay":
			assert.Equal(t, Decision{Action: Ack}, d, name)
		default:
			assert.Equal(t, Retry, d.Action, name)
			assert.Equal(t, 7*time.Second, d.Delay, name)
			assert.ErrorIs(t, d.Err, idem.ErrOutcomeUnknown, name)
		}
	}
}

func TestActionNames(t *testing.T) {
	assert.Equal(t, "ack", Ack.String())
	assert.Equal(t, "reject", Reject.String())
	assert.Equal(t, "retry", Retry.String())
	assert.Equal(t, "Action(9)", Action(9).String())
}

// BusyWait bounds a duplicate's wait for the delivery that runs, not that
// delivery's handler, which runs past it and is recorded.
func TestBusyWaitBoundsTheWaitNotTheHandler(t *testing.T) {
	c := consumer(t, idemtest.NewMemoryBackend(), Options{BusyWait: 50 * time.Millisecond})
	ctx := context.Background()
	started, release := make(chan struct{}), make(chan struct{})
	first := make(chan Decision, 1)
	go func() {
		first <- c.Handle(ctx, "m1", "body", func(context.Context) (int, error) { close(started); <-release; return 1, nil })
	}()
	<-started
	d := c.Handle(ctx, "m1", "body", func(context.Context) (int, error) { t.Error("ran twice"); return 0, nil })
	assert.Equal(t, Retry, d.Action, "a duplicate waits BusyWait, not for ever")
	assert.ErrorIs(t, d.Err, idem.ErrInProgress)
	close(release) // past BusyWait
	assert.Equal(t, Decision{Action: Ack}, <-first)
	assert.Equal(t, Decision{Action: Ack, Replayed: true}, c.Handle(ctx, "m1", "body", nil))
}

func TestHandleRefusesANilContext(t *testing.T) {
	c := consumer(t, idemtest.NewMemoryBackend(), Options{})
	//lint:ignore SA1012 the nil context is the point
	d := c.Handle(nil, "m1", "body", func(context.Context) (int, error) { t.Error("ran"); return 0, nil })
	assert.Equal(t, Retry, d.Action)
	assert.Error(t, d.Err)
}
