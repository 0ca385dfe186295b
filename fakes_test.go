package idem_test

import (
	"context"
	"errors"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/bolt"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/stretchr/testify/require"
)

// Backends that misbehave on purpose, and what the tests of the core need
// to drive and watch them.

// errLost stands for a reply lost on its way back: a broken connection.
var errLost = errors.New("connection reset by peer")

// loseOnce returns a Lose function that loses the reply to op once.
func loseOnce(op string) func(string) error {
	var once sync.Once
	return func(o string) error {
		var err error
		if o == op {
			once.Do(func() { err = errLost })
		}
		return err
	}
}

// retryingClient sends every claim twice, as a client library does when
// the first reply is lost: the second finds the first's record.
type retryingClient struct{ backend.Backend }

func (r retryingClient) Claim(ctx context.Context, rec backend.Record, now time.Time, lease time.Duration) (backend.Record, bool, error) {
	if _, _, err := r.Backend.Claim(ctx, rec, now, lease); err != nil {
		return backend.Record{}, false, err
	}
	return r.Backend.Claim(ctx, rec, now, lease)
}

// hooked wraps a Backend with functions that run around its calls.
type hooked struct {
	backend.Backend
	claim func(ctx context.Context, rec backend.Record, now time.Time, lease time.Duration) (backend.Record, bool, error)
	renew func(ctx context.Context) error
	get   func(ctx context.Context) error
}

func (h hooked) Claim(ctx context.Context, rec backend.Record, now time.Time, lease time.Duration) (backend.Record, bool, error) {
	if h.claim != nil {
		return h.claim(ctx, rec, now, lease)
	}
	return h.Backend.Claim(ctx, rec, now, lease)
}

func (h hooked) Renew(ctx context.Context, key, token string, now time.Time, lease time.Duration) error {
	if h.renew != nil {
		if err := h.renew(ctx); err != nil {
			return err
		}
	}
	return h.Backend.Renew(ctx, key, token, now, lease)
}

func (h hooked) Get(ctx context.Context, key string, now time.Time) (backend.Record, bool, error) {
	if h.get != nil {
		if err := h.get(ctx); err != nil {
			return backend.Record{}, false, err
		}
	}
	return h.Backend.Get(ctx, key, now)
}

// claimLostThenDown is a backend over mem where a claim lands but its
// reply is lost, and from then on every other call fails until down is
// cleared: nobody can tell whether the claim landed.
func claimLostThenDown(mem backend.Backend) (backend.Backend, *atomic.Bool) {
	var down atomic.Bool
	return idemtest.Faulty{Backend: mem,
		Lose: func(op string) error {
			if op == "Claim" {
				down.Store(true)
				return errLost
			}
			return nil
		},
		Fail: func(op string) error {
			if down.Load() && op != "Claim" {
				return errLost
			}
			return nil
		},
	}, &down
}

// waitFor polls cond for up to ten seconds.
func waitFor(t *testing.T, cond func() bool, msg string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out: %s", msg)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func absent(mem *idemtest.MemoryBackend, key string) func() bool {
	return func() bool {
		_, ok, err := mem.Get(context.Background(), key, time.Now())
		return err == nil && !ok
	}
}

// runtimeGC runs a collection, so that a dropped Ticket's finalizer runs.
func runtimeGC() { runtime.GC() }

// fakeClock is an injectable clock that moves only when told to.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Now().UTC().Truncate(time.Second)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// newStore returns a store with opts that is closed when the test ends
// (before a backend whose cleanup was registered first).
func newStore[R any](t *testing.T, opts idem.Options) *idem.Store[R] {
	t.Helper()
	s := idem.New[R](opts)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// runToEnd runs f on a goroutine of its own (f may Goexit) and fails the
// test if it has not ended within a few seconds.
func runToEnd(t *testing.T, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("call did not return")
	}
}

// stepBackends are the Steppers the table tests run on: one in memory, one
// in a file.
var stepBackends = []struct {
	name string
	b    func(t *testing.T) backend.Backend
}{
	{"memory", func(*testing.T) backend.Backend { return idemtest.NewMemoryBackend() }},
	{"bolt", func(t *testing.T) backend.Backend { return openBolt(t) }},
}

// openBolt opens a bolt file closed when the test ends.
func openBolt(t *testing.T) *bolt.Backend {
	t.Helper()
	b, err := bolt.Open(filepath.Join(t.TempDir(), "idem.db"), nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// atRecoveryPoint leaves key at a recovery point: one step "a" recorded
// (returning 1), then an ordinary error.
func atRecoveryPoint(t *testing.T, s *idem.Store[string], key, payload string) {
	t.Helper()
	_, err := s.RunOnce(context.Background(), key, payload, func(ctx context.Context) (string, error) {
		if _, err := idem.Step(ctx, "a", func(context.Context) (int, error) { return 1, nil }); err != nil {
			return "", err
		}
		return "", errors.New("transient: stop at the recovery point")
	})
	require.Error(t, err)
	require.False(t, idem.IsFinal(err))
}

type stepOutcome struct {
	val string
	err error
}

// order is the result type of the durable tests.
type order struct {
	ID     int
	Amount int
}

// durableStore returns a store over b that is closed when the test ends.
func durableStore(t *testing.T, b backend.Backend, opts idem.Options) *idem.Store[order] {
	t.Helper()
	opts.Backend = b
	s := idem.New[order](opts)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func countingFn(v order) (*atomic.Int32, func(context.Context) (order, error)) {
	var calls atomic.Int32
	return &calls, func(context.Context) (order, error) {
		calls.Add(1)
		return v, nil
	}
}

func mustFingerprint(t *testing.T, payload any) idem.Fingerprint {
	t.Helper()
	fp, err := idem.DefaultFingerprint(payload)
	require.NoError(t, err)
	return fp
}
