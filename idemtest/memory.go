package idemtest

import (
	"context"
	"sort"
	"sync"
	"time"

	"github.com/seed094d4201/idem"
)

// MemoryBackend is an idem.Backend that keeps records in a map: the
// reference that the conformance suite is checked against, and a stand-in
// for a durable backend in tests. It survives a Store being closed and
// reopened on it, and Crash makes it look as a durable backend does after
// its process died. It is safe for concurrent use.
type MemoryBackend struct {
	mu      sync.Mutex
	records map[string]idem.Record // guarded by mu; values own their bytes
}

var _ idem.Backend = (*MemoryBackend)(nil)

// NewMemoryBackend returns an empty MemoryBackend.
func NewMemoryBackend() *MemoryBackend {
	return &MemoryBackend{records: make(map[string]idem.Record)}
}

func (m *MemoryBackend) Claim(ctx context.Context, rec idem.Record, now time.Time, lease time.Duration) (idem.Record, bool, error) {
	if err := ctx.Err(); err != nil {
		return idem.Record{}, false, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if old, ok := m.records[rec.Key]; ok {
		if seen, ok := old.SeenAt(now); ok {
			return clone(seen), false, nil
		}
	}
	claim := idem.Record{Key: rec.Key, Fingerprint: rec.Fingerprint, Token: rec.Token, State: idem.StatePending, CreatedAt: now}
	if lease > 0 {
		claim.LeaseUntil = now.Add(lease)
	}
	m.records[rec.Key] = claim
	return claim, true, nil
}

func (m *MemoryBackend) Complete(ctx context.Context, rec idem.Record, now time.Time, ttl time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.ownedLocked(rec.Key, rec.Token) {
		return idem.ErrNotOwner
	}
	done := m.records[rec.Key]
	done.State, done.ExpiresAt, done.LeaseUntil = idem.StateCompleted, now.Add(ttl), time.Time{}
	done.Value, done.Failed, done.ErrMsg = rec.Value, rec.Failed, rec.ErrMsg
	m.records[rec.Key] = clone(done)
	return nil
}

func (m *MemoryBackend) Release(ctx context.Context, key, token string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.ownedLocked(key, token) {
		return idem.ErrNotOwner
	}
	delete(m.records, key)
	return nil
}

// ownedLocked reports whether key's record is an unfinished claim held by
// token. The caller holds mu.
func (m *MemoryBackend) ownedLocked(key, token string) bool {
	old, ok := m.records[key]
	return ok && old.Token == token && old.State != idem.StateCompleted
}

func (m *MemoryBackend) Get(ctx context.Context, key string, now time.Time) (idem.Record, bool, error) {
	if err := ctx.Err(); err != nil {
		return idem.Record{}, false, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	rec, ok := m.records[key]
	if !ok {
		return idem.Record{}, false, nil
	}
	rec, ok = rec.SeenAt(now)
	return clone(rec), ok, nil
}

func (m *MemoryBackend) Renew(ctx context.Context, key, token string, now time.Time, lease time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	rec, ok := m.records[key]
	if !ok || rec.Token != token || rec.State != idem.StatePending || rec.Lapsed(now) {
		return idem.ErrNotOwner
	}
	rec.LeaseUntil = now.Add(lease)
	m.records[key] = rec
	return nil
}

func (m *MemoryBackend) Forget(ctx context.Context, key string, now time.Time) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if rec := m.records[key]; rec.State == idem.StatePending && !rec.Lapsed(now) {
		return idem.ErrInProgress
	}
	delete(m.records, key)
	return nil
}

func (m *MemoryBackend) Sweep(ctx context.Context, now time.Time, limit int) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	var expired []idem.Record
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

// Crash makes every pending record interrupted, as a durable backend finds
// them when it reopens after its process died mid-operation.
func (m *MemoryBackend) Crash() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for k, rec := range m.records {
		if rec.State == idem.StatePending {
			rec.State = idem.StateInterrupted
			m.records[k] = rec
		}
	}
}

// Len returns the number of records held.
func (m *MemoryBackend) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.records)
}

// clone copies rec's Value so that neither caller nor backend can change the
// other's bytes.
func clone(rec idem.Record) idem.Record {
	if rec.Value != nil {
		rec.Value = append([]byte{}, rec.Value...)
	}
	return rec
}
