package idem

import (
	"context"
	"sync"
	"testing"
	"time"

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
