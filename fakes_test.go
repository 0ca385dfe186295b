package idem_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemtest"
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
