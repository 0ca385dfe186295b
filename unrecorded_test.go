package idem_test

import (
	"context"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An outcome the backend refuses to record is held in memory and retried
// in the background; meanwhile its claim keeps its lease, so that another
// store never takes the key for interrupted and runs it a second time
// while its owner is alive (issue 18: finishing used to stop renewals).
func TestUnrecordedOutcomeKeepsItsLease(t *testing.T) {
	mem := idemtest.NewMemoryBackend()
	var down atomic.Bool
	down.Store(true)
	b := idemtest.Faulty{Backend: mem, Fail: func(op string) error {
		if op == "Complete" && down.Load() {
			return errLost
		}
		return nil
	}}
	const lease = 600 * time.Millisecond // renewed every 200 ms: room for a loaded CI machine
	var un idemtest.Unrecorded
	s := durableStore(t, b, idem.Options{SettleTimeout: 20 * time.Millisecond, Lease: lease, Observer: un.Observer()})
	calls, fn := countingFn(order{1, 1})
	v, err := s.RunOnce(context.Background(), "k", "p", fn)
	require.NoError(t, err)
	require.NotNil(t, un.Of("k"))
	assert.Equal(t, order{1, 1}, v)

	// Many leases later, the record is still a live claim: another store
	// that would rerun an interrupted key waits rather than runs.
	other := durableStore(t, mem, idem.Options{RetryInterrupted: true, Resume: true})
	for end := time.Now().Add(4 * lease); time.Now().Before(end); {
		rec, ok, err := mem.Get(context.Background(), "k", time.Now())
		require.NoError(t, err)
		require.True(t, ok)
		require.Equal(t, backend.StatePending, rec.State, "the claim of a live owner lapsed")
		ctx, cancel := context.WithTimeout(context.Background(), lease/4)
		_, err = other.RunOnce(ctx, "k", "p", fn)
		cancel()
		require.ErrorIs(t, err, idem.ErrInProgress)
	}
	require.Equal(t, int32(1), calls.Load(), "fn ran twice")

	down.Store(false)
	waitFor(t, func() bool { return s.Len() == 0 }, "the outcome is recorded once the backend takes it")
	v, err = other.RunOnce(context.Background(), "k", "p", fn)
	require.NoError(t, err)
	assert.Equal(t, order{1, 1}, v)
	assert.Equal(t, int32(1), calls.Load())
}

// tokenFaulty fails Complete for the claims fail picks, by token, and
// every Get while blind is set; with exit set, the next Complete ends its
// goroutine (runtime.Goexit) instead.
type tokenFaulty struct {
	backend.Backend
	fail    func(token string) bool
	blind   atomic.Bool
	exit    atomic.Bool
	refused atomic.Int32 // ErrNotOwner answers to Complete
}

func (f *tokenFaulty) Get(ctx context.Context, key string, now time.Time) (backend.Record, bool, error) {
	if f.blind.Load() {
		return backend.Record{}, false, errLost
	}
	return f.Backend.Get(ctx, key, now)
}

func (f *tokenFaulty) Complete(ctx context.Context, rec backend.Record, now time.Time, ttl time.Duration) error {
	if f.exit.Swap(false) {
		runtime.Goexit()
	}
	if f.fail(rec.Token) {
		return errLost
	}
	err := f.Backend.Complete(ctx, rec, now, ttl)
	if err == backend.ErrNotOwner {
		f.refused.Add(1)
	}
	return err
}

// A background write of an old execution's outcome that finds the key in
// other hands drops its own pin only, never the outcome of the execution
// that now holds the key (issue 18: it unpinned by key, and the key ran a
// third time). The old execution's entry left memory as its write went
// on in the background: its Backend ended the goroutine in the write.
func TestStaleBackgroundWriteKeepsNewerOutcome(t *testing.T) {
	mem := idemtest.NewMemoryBackend()
	var first atomic.Value // the first execution's token
	first.Store("")
	healed := atomic.Bool{}
	b := &tokenFaulty{Backend: mem, fail: func(token string) bool {
		return !healed.Load() || token != first.Load()
	}}
	b.blind.Store(true) // no write's fate can be read back: each goes on in the background
	var un idemtest.Unrecorded
	s := durableStore(t, b, idem.Options{SettleTimeout: 20 * time.Millisecond, Observer: un.Observer()})
	var calls atomic.Int32
	run := func() (order, error) {
		return s.RunOnce(context.Background(), "k", "p", func(context.Context) (order, error) {
			n := int(calls.Add(1))
			return order{n, n}, nil
		})
	}
	b.exit.Store(true)
	ran := make(chan struct{})
	go func() { // the Backend ends this goroutine
		defer close(ran)
		_, _ = run()
	}()
	<-ran
	waitFor(t, func() bool { return s.Len() == 0 }, "the first execution's entry to leave memory")

	// The operator decides the first execution did not count: its claim is
	// dropped in the backend.
	rec, ok, err := mem.Get(context.Background(), "k", time.Now())
	require.NoError(t, err)
	require.True(t, ok)
	first.Store(rec.Token)
	require.NoError(t, mem.Release(context.Background(), "k", rec.Token))

	v, err := run()
	require.NoError(t, err)
	require.Equal(t, 1, un.Count("k"), "the second execution's outcome not recorded")
	require.Equal(t, order{2, 2}, v)

	b.blind.Store(false)
	healed.Store(true) // the first execution's write now reaches the backend, which refuses it
	waitFor(t, func() bool { return b.refused.Load() > 0 }, "the first execution's write is refused")
	for end := time.Now().Add(300 * time.Millisecond); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		v, err := s.RunOnce(ctx, "k", "p", func(context.Context) (order, error) {
			calls.Add(1)
			return order{}, nil
		})
		cancel()
		require.NoError(t, err, "memory replays the pinned outcome")
		require.Equal(t, order{2, 2}, v, "the second execution's outcome was dropped")
	}
	assert.Equal(t, int32(2), calls.Load())
}
