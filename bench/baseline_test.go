package bench

import (
	"context"
	"crypto/sha256"
	"errors"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"
)

// mutexMap is the simplest correct in-process idempotency table: one mutex,
// one map that keeps every outcome, no coalescing of waiters, no expiry, no
// panic safety. It is what idem's core must not be much slower than.
type mutexMap struct {
	mu sync.Mutex
	m  map[string]*mutexMapEntry
}

type mutexMapEntry struct {
	fp      [sha256.Size]byte
	val     receipt
	expires time.Time
}

var (
	errMismatch = errors.New("mismatch")
	errInFlight = errors.New("in flight")
	errExpired  = errors.New("expired")
)

func newMutexMap() *mutexMap { return &mutexMap{m: make(map[string]*mutexMapEntry)} }

// do claims key, runs fn, stores and keeps its result; a known key is looked
// up, its fingerprint compared and its expiry checked against the clock. A
// key still in flight is refused: the baseline does not coalesce.
func (mm *mutexMap) do(key string, payload []byte, fn func() (receipt, error)) (receipt, error) {
	fp := sha256.Sum256(payload)
	mm.mu.Lock()
	if e, ok := mm.m[key]; ok {
		known := *e
		mm.mu.Unlock()
		switch {
		case known.fp != fp:
			return receipt{}, errMismatch
		case known.expires.IsZero():
			return receipt{}, errInFlight
		case time.Now().After(known.expires):
			return receipt{}, errExpired
		}
		return known.val, nil
	}
	e := &mutexMapEntry{fp: fp}
	mm.m[key] = e
	mm.mu.Unlock()
	v, err := fn()
	mm.mu.Lock()
	e.val, e.expires = v, time.Now().Add(24*time.Hour)
	mm.mu.Unlock()
	return v, err
}

// doDetached is do with fn on a goroutine of its own, the caller waiting
// for it or for ctx: the least a table costs whose caller may leave while
// fn goes on, as idem's does when the caller's ctx can end.
func (mm *mutexMap) doDetached(ctx context.Context, key string, payload []byte, fn func() (receipt, error)) (receipt, error) {
	fp := sha256.Sum256(payload)
	mm.mu.Lock()
	if _, ok := mm.m[key]; ok {
		mm.mu.Unlock()
		return receipt{}, errInFlight // the new key rows never replay
	}
	e := &mutexMapEntry{fp: fp}
	mm.m[key] = e
	mm.mu.Unlock()
	type result struct {
		v   receipt
		err error
	}
	done := make(chan result, 1)
	go func() {
		v, err := fn()
		mm.mu.Lock()
		e.val, e.expires = v, time.Now().Add(24*time.Hour)
		mm.mu.Unlock()
		done <- result{v, err}
	}()
	select {
	case r := <-done:
		return r.v, r.err
	case <-ctx.Done():
		return receipt{}, ctx.Err()
	}
}

// singleflightDo is singleflight.Group.Do with the payload's SHA-256, the
// least work that coalesces concurrent duplicates. It keeps nothing.
func singleflightDo(g *singleflight.Group, key string, payload []byte, fn func() (any, error)) (any, error) {
	_ = sha256.Sum256(payload)
	v, err, _ := g.Do(key, fn)
	return v, err
}
