package limit

import "sync"

// Waiters caps the requests that are held at once for one key: the one
// whose handler runs and those waiting for its outcome. It is safe for
// concurrent use; a key with no request held has no entry.
type Waiters struct {
	max  int
	mu   sync.Mutex
	held map[string]int // guarded by mu
}

// DefaultWaiters is the cap when none is given.
const DefaultWaiters = 8

// NewWaiters returns a cap of n requests at once per key besides the one
// that runs: zero means DefaultWaiters, negative no cap.
func NewWaiters(n int) *Waiters {
	if n == 0 {
		n = DefaultWaiters
	}
	return &Waiters{max: n, held: make(map[string]int)}
}

// Enter holds one more request for key and reports whether the cap allows
// it; if it does, the caller must call Leave(key) when the request is done.
func (w *Waiters) Enter(key string) bool {
	if w == nil || w.max <= 0 {
		return true
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.held[key] > w.max {
		return false
	}
	w.held[key]++
	return true
}

// Leave ends a request that Enter held.
func (w *Waiters) Leave(key string) {
	if w == nil || w.max <= 0 {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.held[key]--; w.held[key] <= 0 {
		delete(w.held, key)
	}
}

// Keys returns how many keys have requests held, for tests of the cap's own
// memory.
func (w *Waiters) Keys() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.held)
}
