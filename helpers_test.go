package idem

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/seed094d4201/idem/backend"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// fakeClock is an injectable clock that moves only when told to.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Now().UTC().Truncate(time.Second)}
}

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

// newStore returns a store with opts that is closed when the test ends.
func newStore[R any](t *testing.T, opts Options) *Store[R] {
	t.Helper()
	s := New[R](opts)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// waitersParked installs testHookWait for the test and returns a channel
// that is closed once n callers have started waiting on executions in flight.
func waitersParked(t *testing.T, n int) <-chan struct{} {
	t.Helper()
	parked := make(chan struct{})
	var mu sync.Mutex
	count := 0
	testHookWait = func() {
		mu.Lock()
		defer mu.Unlock()
		if count++; count == n {
			close(parked)
		}
	}
	t.Cleanup(func() { testHookWait = nil })
	return parked
}

// outcome is what one RunOnce call returned.
type outcome[R any] struct {
	val R
	err error
}

// runAsync calls s.RunOnce in a new goroutine and delivers its outcome.
func runAsync[R any](ctx context.Context, s *Store[R], key string, payload any, fn func(context.Context) (R, error)) <-chan outcome[R] {
	ch := make(chan outcome[R], 1)
	go func() {
		v, err := s.RunOnce(ctx, key, payload, fn)
		ch <- outcome[R]{v, err}
	}()
	return ch
}

// stubBackend is a minimal in-memory Backend for this package's tests
// (package idem cannot import idemtest). Like real clients, every call
// fails once its ctx is done. No leases.
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
