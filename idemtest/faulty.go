package idemtest

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/seed094d4201/idem/backend"
)

// Faulty wraps a Backend and fails the operations its functions pick. Both
// are called with the operation's name ("Claim", "Complete", "Release",
// "Renew", "Get", "Forget", "Sweep", and "RecordStep", "Resume", "Each");
// a nil function, or a nil error from it, lets the call through. They must
// be safe for concurrent use.
//
// Faulty is a backend.Stepper and a backend.Lister too, so that a fault
// test of Resume or of Records through it tests them: their calls go
// through to the wrapped Backend, and fail with errors.ErrUnsupported if it
// is not one.
type Faulty struct {
	backend.Backend

	// Fail fails an operation before it reaches the wrapped backend: an
	// unreachable database, a full disk.
	Fail func(op string) error

	// Lose lets an operation reach the wrapped backend, then returns its
	// error in place of the reply: the write landed, but its reply was lost
	// on the way back.
	Lose func(op string) error
}

var (
	_ backend.Stepper = Faulty{}
	_ backend.Lister  = Faulty{}
)

func (f Faulty) fail(op string) error {
	if f.Fail == nil {
		return nil
	}
	return f.Fail(op)
}

// lose returns the error that replaces op's reply, if any.
func (f Faulty) lose(op string) error {
	if f.Lose == nil {
		return nil
	}
	return f.Lose(op)
}

func (f Faulty) Claim(ctx context.Context, rec backend.Record, now time.Time, lease time.Duration) (backend.Record, bool, error) {
	if err := f.fail("Claim"); err != nil {
		return backend.Record{}, false, err
	}
	got, won, err := f.Backend.Claim(ctx, rec, now, lease)
	if lerr := f.lose("Claim"); lerr != nil {
		return backend.Record{}, false, lerr
	}
	return got, won, err
}

func (f Faulty) Complete(ctx context.Context, rec backend.Record, now time.Time, ttl time.Duration) error {
	if err := f.fail("Complete"); err != nil {
		return err
	}
	err := f.Backend.Complete(ctx, rec, now, ttl)
	if lerr := f.lose("Complete"); lerr != nil {
		return lerr
	}
	return err
}

func (f Faulty) Release(ctx context.Context, key, token string) error {
	if err := f.fail("Release"); err != nil {
		return err
	}
	err := f.Backend.Release(ctx, key, token)
	if lerr := f.lose("Release"); lerr != nil {
		return lerr
	}
	return err
}

func (f Faulty) Get(ctx context.Context, key string, now time.Time) (backend.Record, bool, error) {
	if err := f.fail("Get"); err != nil {
		return backend.Record{}, false, err
	}
	rec, ok, err := f.Backend.Get(ctx, key, now)
	if lerr := f.lose("Get"); lerr != nil {
		return backend.Record{}, false, lerr
	}
	return rec, ok, err
}

func (f Faulty) Renew(ctx context.Context, key, token string, now time.Time, lease time.Duration) error {
	if err := f.fail("Renew"); err != nil {
		return err
	}
	err := f.Backend.Renew(ctx, key, token, now, lease)
	if lerr := f.lose("Renew"); lerr != nil {
		return lerr
	}
	return err
}

func (f Faulty) Forget(ctx context.Context, key string, now time.Time) error {
	if err := f.fail("Forget"); err != nil {
		return err
	}
	err := f.Backend.Forget(ctx, key, now)
	if lerr := f.lose("Forget"); lerr != nil {
		return lerr
	}
	return err
}

func (f Faulty) Sweep(ctx context.Context, now time.Time, limit int) (int, error) {
	if err := f.fail("Sweep"); err != nil {
		return 0, err
	}
	n, err := f.Backend.Sweep(ctx, now, limit)
	if lerr := f.lose("Sweep"); lerr != nil {
		return 0, lerr
	}
	return n, err
}

// Unwrap returns the wrapped Backend, so that a Store can tell whether
// the Stepper that Faulty passes through is really there.
func (f Faulty) Unwrap() backend.Backend { return f.Backend }

func (f Faulty) stepper() (backend.Stepper, error) {
	if st, ok := f.Backend.(backend.Stepper); ok {
		return st, nil
	}
	return nil, fmt.Errorf("idemtest: Faulty wraps %T, which records no steps: %w", f.Backend, errors.ErrUnsupported)
}

func (f Faulty) RecordStep(ctx context.Context, key, token string, step backend.Step, now time.Time) error {
	st, err := f.stepper()
	if err != nil {
		return err
	}
	if err := f.fail("RecordStep"); err != nil {
		return err
	}
	err = st.RecordStep(ctx, key, token, step, now)
	if lerr := f.lose("RecordStep"); lerr != nil {
		return lerr
	}
	return err
}

func (f Faulty) Resume(ctx context.Context, key, old, token string, now time.Time, lease time.Duration) (backend.Record, error) {
	st, err := f.stepper()
	if err != nil {
		return backend.Record{}, err
	}
	if err := f.fail("Resume"); err != nil {
		return backend.Record{}, err
	}
	rec, err := st.Resume(ctx, key, old, token, now, lease)
	if lerr := f.lose("Resume"); lerr != nil {
		return backend.Record{}, lerr
	}
	return rec, err
}

func (f Faulty) Each(ctx context.Context, fn func(backend.Record) error) error {
	l, ok := f.Backend.(backend.Lister)
	if !ok {
		return fmt.Errorf("idemtest: Faulty wraps %T, which cannot list its records: %w", f.Backend, errors.ErrUnsupported)
	}
	if err := f.fail("Each"); err != nil {
		return err
	}
	return l.Each(ctx, fn)
}
