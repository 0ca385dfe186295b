package idem

import (
	"context"

	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/internal/seam"
)

// The transactional modes of this module keep a key's record in their own
// transaction, beside the caller's writes, and so need of a Store what its
// users never do: a claim in memory only, a finish that counts as a
// replay, the Codec on records, the options with defaults applied. They
// reach it through a seam of this module's own, outside the user's API, as
// database/sql keeps the driver's apart.

func init() {
	seam.Local = func(store any) any {
		if l, ok := store.(interface{ local() any }); ok {
			return l.local()
		}
		return nil
	}
}

func (s *Store[R]) local() any {
	if s == nil {
		return nil
	}
	return localStore[R]{s}
}

// localStore is a Store's transactional view, as the transactional
// modes use it.
type localStore[R any] struct{ s *Store[R] }

// BeginLocal claims key in the store's memory only (beginLocal).
func (l localStore[R]) BeginLocal(ctx context.Context, key string, payload any) (*Ticket[R], error) {
	return l.s.beginLocal(ctx, key, payload)
}

// FinishReplayed finishes t, from BeginLocal, with an outcome its caller
// found recorded (finishReplayed).
func (localStore[R]) FinishReplayed(t *Ticket[R], val R, err error) (R, error) {
	return t.finishReplayed(val, err)
}

// Encode fills a completed record's outcome with the store's Codec.
func (l localStore[R]) Encode(rec *backend.Record, val R, err error) error {
	return l.s.encode(rec, val, err)
}

// Decode returns the outcome a completed record holds.
func (l localStore[R]) Decode(rec backend.Record) (R, error) { return l.s.decode(rec) }

// Options returns the options the store runs with, defaults applied.
func (l localStore[R]) Options() Options { return l.s.opts }

// Get reads key's record through the store's guard, as the store's own
// reads do: a Backend that panics or ends the goroutine is an error.
func (l localStore[R]) Get(ctx context.Context, key string) (backend.Record, bool, error) {
	if l.s.opts.Backend == nil {
		return backend.Record{}, false, nil
	}
	return l.s.b.Get(ctx, key, l.s.opts.Now())
}
