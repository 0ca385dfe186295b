package idemtest

import (
	"context"
	"time"

	"github.com/seed094d4201/idem"
)

// Faulty wraps a Backend and fails the operations its Fail function picks,
// before they reach the wrapped backend: an unreachable database, a full
// disk. Fail is called with the operation's name ("Claim", "Complete",
// "Release", "Renew", "Get", "Forget", "Sweep"); a nil Fail, or a nil error from it,
// lets the call through. Fail must be safe for concurrent use.
type Faulty struct {
	idem.Backend
	Fail func(op string) error
}

var _ idem.Backend = Faulty{}

func (f Faulty) fail(op string) error {
	if f.Fail == nil {
		return nil
	}
	return f.Fail(op)
}

func (f Faulty) Claim(ctx context.Context, rec idem.Record, now time.Time, lease time.Duration) (idem.Record, bool, error) {
	if err := f.fail("Claim"); err != nil {
		return idem.Record{}, false, err
	}
	return f.Backend.Claim(ctx, rec, now, lease)
}

func (f Faulty) Complete(ctx context.Context, rec idem.Record, now time.Time, ttl time.Duration) error {
	if err := f.fail("Complete"); err != nil {
		return err
	}
	return f.Backend.Complete(ctx, rec, now, ttl)
}

func (f Faulty) Release(ctx context.Context, key, token string) error {
	if err := f.fail("Release"); err != nil {
		return err
	}
	return f.Backend.Release(ctx, key, token)
}

func (f Faulty) Get(ctx context.Context, key string, now time.Time) (idem.Record, bool, error) {
	if err := f.fail("Get"); err != nil {
		return idem.Record{}, false, err
	}
	return f.Backend.Get(ctx, key, now)
}

func (f Faulty) Renew(ctx context.Context, key, token string, now time.Time, lease time.Duration) error {
	if err := f.fail("Renew"); err != nil {
		return err
	}
	return f.Backend.Renew(ctx, key, token, now, lease)
}

func (f Faulty) Forget(ctx context.Context, key string, now time.Time) error {
	if err := f.fail("Forget"); err != nil {
		return err
	}
	return f.Backend.Forget(ctx, key, now)
}

func (f Faulty) Sweep(ctx context.Context, now time.Time, limit int) (int, error) {
	if err := f.fail("Sweep"); err != nil {
		return 0, err
	}
	return f.Backend.Sweep(ctx, now, limit)
}
