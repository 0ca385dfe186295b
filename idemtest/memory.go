package idemtest

import (
	"context"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
)

// MemoryBackend is an backend.Backend that keeps records in a map: the
// reference that the conformance suite is checked against, and a stand-in
// for a durable backend in tests. It survives a Store being closed and
// reopened on it, and Crash makes it look as a durable backend does after
// its process died. It is safe for concurrent use.
type MemoryBackend struct {
	mu      sync.Mutex
	records map[string]backend.Record // guarded by mu; values own their bytes
	closed  atomic.Bool               // set by Close: every later call is refused
}

// Close ends the backend, as a durable one's Close does: every later call
// returns an error matching backend.ErrClosed. It is idempotent.
func (m *MemoryBackend) Close() error {
	m.closed.Store(true)
	return nil
}

var _ backend.Backend = (*MemoryBackend)(nil)

// NewMemoryBackend returns an empty MemoryBackend.
func NewMemoryBackend() *MemoryBackend {
	return &MemoryBackend{records: make(map[string]backend.Record)}
}

func (m *MemoryBackend) Claim(ctx context.Context, rec backend.Record, now time.Time, lease time.Duration) (backend.Record, bool, error) {
	if err := m.refuse(ctx); err != nil {
		return backend.Record{}, false, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if old, ok := m.records[rec.Key]; ok {
		if seen, ok := old.SeenAt(now); ok {
			return clone(seen), false, nil
		}
	}
	claim := backend.Record{Key: rec.Key, Fingerprint: rec.Fingerprint, Token: rec.Token, State: backend.StatePending, CreatedAt: now}
	if lease > 0 {
		claim.LeaseUntil = now.Add(lease)
	}
	m.records[rec.Key] = claim
	return claim, true, nil
}

func (m *MemoryBackend) Complete(ctx context.Context, rec backend.Record, now time.Time, ttl time.Duration) error {
	if err := m.refuse(ctx); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.ownedLocked(rec.Key, rec.Token) {
		return backend.ErrNotOwner
	}
	done := m.records[rec.Key]
	done.State, done.ExpiresAt, done.LeaseUntil = backend.StateCompleted, now.Add(ttl), time.Time{}
	done.Value, done.Failed, done.ErrMsg = rec.Value, rec.Failed, rec.ErrMsg
	m.records[rec.Key] = clone(done)
	return nil
}

func (m *MemoryBackend) Release(ctx context.Context, key, token string) error {
	if err := m.refuse(ctx); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.ownedLocked(key, token) {
		return backend.ErrNotOwner
	}
	delete(m.records, key)
	return nil
}

// ownedLocked reports whether key's record is an unfinished claim held by
// token. The caller holds mu.
func (m *MemoryBackend) ownedLocked(key, token string) bool {
	old, ok := m.records[key]
	return ok && old.Settleable(token)
}

func (m *MemoryBackend) Get(ctx context.Context, key string, now time.Time) (backend.Record, bool, error) {
	if err := m.refuse(ctx); err != nil {
		return backend.Record{}, false, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	rec, ok := m.records[key]
	if !ok {
		return backend.Record{}, false, nil
	}
	rec, ok = rec.SeenAt(now)
	return clone(rec), ok, nil
}

// Renew renews a lapsed lease too, if the claim is still pending under
// token: a lease judged lapsed by a clock that stepped forward is still
// its live owner's (backend.Backend's Renew).
func (m *MemoryBackend) Renew(ctx context.Context, key, token string, now time.Time, lease time.Duration) error {
	if err := m.refuse(ctx); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	rec, ok := m.records[key]
	if !ok || !rec.ClaimedBy(token) {
		return backend.ErrNotOwner
	}
	rec.LeaseUntil = now.Add(lease)
	m.records[key] = rec
	return nil
}

// changeLive replaces key's record with change's copy of it, if token's
// claim on it is pending and its lease unlapsed at now; otherwise it
// returns ErrNotOwner.
func (m *MemoryBackend) changeLive(ctx context.Context, key, token string, now time.Time, change func(backend.Record) backend.Record) error {
	if err := m.refuse(ctx); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	rec, ok := m.records[key]
	if !ok || !rec.HeldBy(token, now) {
		return backend.ErrNotOwner
	}
	m.records[key] = change(rec)
	return nil
}

func (m *MemoryBackend) Forget(ctx context.Context, key string, now time.Time) error {
	if err := m.refuse(ctx); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if rec := m.records[key]; rec.Live(now) {
		return idem.ErrInProgress
	}
	delete(m.records, key)
	return nil
}

func (m *MemoryBackend) Sweep(ctx context.Context, now time.Time, limit int) (int, error) {
	if err := m.refuse(ctx); err != nil {
		return 0, err
	}
	if limit <= 0 {
		return 0, nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	var expired []backend.Record
	for _, rec := range m.records {
		if rec.Expired(now) {
			expired = append(expired, rec)
		}
	}
	sort.Slice(expired, func(i, j int) bool { return expired[i].ExpiresAt.Before(expired[j].ExpiresAt) })
	if len(expired) > limit {
		expired = expired[:limit]
	}
	for _, rec := range expired {
		delete(m.records, rec.Key)
	}
	return len(expired), nil
}

// refuse refuses a call after Close, and one whose ctx has ended before
// it did anything, as backend.ErrRefused's doc asks: a bare ctx error
// would leave the Store watching for a write that can never land (and
// Close waiting for it).
func (m *MemoryBackend) refuse(ctx context.Context) error {
	if m.closed.Load() {
		return backend.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return backend.Refuse(err)
	}
	return nil
}

// Crash makes every pending record interrupted, as a durable backend finds
// them when it reopens after its process died mid-operation.
func (m *MemoryBackend) Crash() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for k, rec := range m.records {
		m.records[k] = rec.WithOwnerDead()
	}
}

// Len returns the number of records held.
func (m *MemoryBackend) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.records)
}

// clone copies rec's bytes (Value, Steps) so that neither caller nor
// backend can change the other's.
func clone(rec backend.Record) backend.Record {
	if rec.Value != nil {
		rec.Value = append([]byte{}, rec.Value...)
	}
	if rec.Steps != nil {
		steps := make([]backend.Step, len(rec.Steps))
		for i, s := range rec.Steps {
			if s.Value != nil {
				s.Value = append([]byte{}, s.Value...)
			}
			steps[i] = s
		}
		rec.Steps = steps
	}
	return rec
}

// RecordStep records step under key's claim held by token.
func (m *MemoryBackend) RecordStep(ctx context.Context, key, token string, step backend.Step, now time.Time) error {
	step.At = now
	return m.changeLive(ctx, key, token, now, func(rec backend.Record) backend.Record {
		return clone(rec.WithStep(step))
	})
}

// Resume takes over key's interrupted record held by old.
func (m *MemoryBackend) Resume(ctx context.Context, key, old, token string, now time.Time, lease time.Duration) (backend.Record, error) {
	if err := m.refuse(ctx); err != nil {
		return backend.Record{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	rec, ok := m.records[key]
	if !ok || !rec.Resumable(old, now) {
		return backend.Record{}, backend.ErrNotOwner
	}
	rec.Token, rec.State, rec.LeaseUntil = token, backend.StatePending, time.Time{}
	if lease > 0 {
		rec.LeaseUntil = now.Add(lease)
	}
	m.records[key] = rec
	return clone(rec), nil
}

var _ backend.Stepper = (*MemoryBackend)(nil)

// eachPage is how many records Each copies under one hold of the lock.
const eachPage = 256

// Each calls fn with every record, as stored, in key order, in pages of
// eachPage records copied under the lock and handed to fn after it is
// released, so fn may call the backend.
func (m *MemoryBackend) Each(ctx context.Context, fn func(backend.Record) error) error {
	after, first := "", true
	for {
		if err := m.refuse(ctx); err != nil {
			return err
		}
		m.mu.Lock()
		var keys []string
		for key := range m.records {
			if first || key > after {
				keys = append(keys, key)
			}
		}
		slices.Sort(keys)
		page := make([]backend.Record, 0, eachPage)
		for _, key := range keys[:min(len(keys), eachPage)] {
			page = append(page, clone(m.records[key]))
		}
		m.mu.Unlock()
		for _, rec := range page {
			if err := ctx.Err(); err != nil {
				return err
			}
			if err := fn(rec); err != nil {
				return err
			}
		}
		if len(page) < eachPage {
			return nil
		}
		after, first = page[len(page)-1].Key, false
	}
}

var _ backend.Lister = (*MemoryBackend)(nil)
