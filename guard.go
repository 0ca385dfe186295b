package idem

import (
	"context"
	"fmt"
	"time"

	"github.com/seed094d4201/idem/backend"
)

// Foreign code is whatever the user supplied or chose: fn, the Backend and
// its optional interfaces, the Codec, the Observer, the Fingerprint and the
// clock. Every call into it is deferred-guarded here, on the caller's
// goroutine and on the store's own alike, so that none can crash the
// process, escape the library or strand a key:
//
//   - a panic is recovered by guard, the only recover in this package, and
//     handed to the site, which turns it into an error of the right kind (a
//     Backend call's fate is then unknown, and is settled as a lost reply
//     is: read back and compared by token);
//   - a runtime.Goexit cannot be stopped: the site learns of it through
//     exiting (or guard's exited) and leaves the key consistent (a claim of
//     unknown fate released in the background, an outcome whose write
//     ended recorded in the background, one the Codec or Observer cut
//     short pinned), and a loop of the store's own starts again on a
//     fresh goroutine.

// guard is deferred directly around a call into foreign code, with
// *returned set true just after the call returns. A panic's value goes to
// panicked (the goroutine goes on); with panicked nil the panic goes on up.
// A Goexit (the call did not return, and nothing was recovered) calls
// exited, if not nil, as the goroutine ends.
func guard(returned *bool, panicked func(v any), exited func()) {
	if *returned {
		return
	}
	v := recover()
	switch {
	case v != nil && panicked != nil:
		panicked(v)
	case v != nil:
		panic(v)
	case exited != nil:
		exited()
	}
}

// exiting is deferred around code that calls foreign code and must settle
// what it holds if that code ends the goroutine or a panic passes through:
// it calls f unless *returned was set. It recovers nothing.
func exiting(returned *bool, f func()) {
	if !*returned {
		f()
	}
}

// errPanicked is the error of a Backend call that panicked: its fate is
// unknown, as a call whose reply was lost.
func errPanicked(method string, v any) error {
	return fmt.Errorf("idem: the Backend's %s panicked: %v", method, v)
}

// guarded is the Store's Backend: each method calls the user's Backend
// under guard, so that a panic becomes an error of unknown fate. It keeps
// the optional interfaces the Store looks for (Stepper, Lister) by asking
// the Backend for them once, at New.
type guarded struct {
	b  backend.Backend
	st backend.Stepper // nil unless b records steps
	ls backend.Lister  // nil unless b lists its records
}

func guardBackend(b backend.Backend) guarded {
	g := guarded{b: b}
	if recordsSteps(b) {
		g.st = b.(backend.Stepper)
	}
	g.ls, _ = b.(backend.Lister)
	return g
}

func (g guarded) Claim(ctx context.Context, rec backend.Record, now time.Time, lease time.Duration) (r backend.Record, ok bool, err error) {
	returned := false
	defer guard(&returned, func(v any) { r, ok, err = backend.Record{}, false, errPanicked("Claim", v) }, nil)
	r, ok, err = g.b.Claim(ctx, rec, now, lease)
	returned = true
	return r, ok, err
}

func (g guarded) Complete(ctx context.Context, rec backend.Record, now time.Time, ttl time.Duration) (err error) {
	returned := false
	defer guard(&returned, func(v any) { err = errPanicked("Complete", v) }, nil)
	err = g.b.Complete(ctx, rec, now, ttl)
	returned = true
	return err
}

func (g guarded) Release(ctx context.Context, key, token string) (err error) {
	returned := false
	defer guard(&returned, func(v any) { err = errPanicked("Release", v) }, nil)
	err = g.b.Release(ctx, key, token)
	returned = true
	return err
}

func (g guarded) Renew(ctx context.Context, key, token string, now time.Time, lease time.Duration) (err error) {
	returned := false
	defer guard(&returned, func(v any) { err = errPanicked("Renew", v) }, nil)
	err = g.b.Renew(ctx, key, token, now, lease)
	returned = true
	return err
}

func (g guarded) Get(ctx context.Context, key string, now time.Time) (r backend.Record, ok bool, err error) {
	returned := false
	defer guard(&returned, func(v any) { r, ok, err = backend.Record{}, false, errPanicked("Get", v) }, nil)
	r, ok, err = g.b.Get(ctx, key, now)
	returned = true
	if err == nil && ok && r.Key != key {
		// Another key's record: acted on (Resolve, a replay when memory
		// is full), it would write or answer the wrong key.
		return backend.Record{}, false, fmt.Errorf("%w: a get of %q answered with a record of %q", errMalformed, key, r.Key)
	}
	return r, ok, err
}

func (g guarded) Forget(ctx context.Context, key string, now time.Time) (err error) {
	returned := false
	defer guard(&returned, func(v any) { err = errPanicked("Forget", v) }, nil)
	err = g.b.Forget(ctx, key, now)
	returned = true
	return err
}

func (g guarded) Sweep(ctx context.Context, now time.Time, limit int) (n int, err error) {
	returned := false
	defer guard(&returned, func(v any) { n, err = 0, errPanicked("Sweep", v) }, nil)
	n, err = g.b.Sweep(ctx, now, limit)
	returned = true
	return n, err
}

// RecordStep and Resume are the Stepper's; the Store calls them only when
// g.st is set.
func (g guarded) RecordStep(ctx context.Context, key, token string, step backend.Step, now time.Time) (err error) {
	returned := false
	defer guard(&returned, func(v any) { err = errPanicked("RecordStep", v) }, nil)
	err = g.st.RecordStep(ctx, key, token, step, now)
	returned = true
	return err
}

func (g guarded) Resume(ctx context.Context, key, old, token string, now time.Time, lease time.Duration) (r backend.Record, err error) {
	returned := false
	defer guard(&returned, func(v any) { r, err = backend.Record{}, errPanicked("Resume", v) }, nil)
	r, err = g.st.Resume(ctx, key, old, token, now, lease)
	returned = true
	return r, err
}

// Each is the Lister's; the Store calls it only when g.ls is set. A panic
// in fn, the Store's own (Store.Records' loop body runs in it), is not the
// Backend's and goes on up: inFn is left set when fn does not return, not
// reset by a deferred call that would run before guard sees the panic.
func (g guarded) Each(ctx context.Context, fn func(backend.Record) error) (err error) {
	returned, inFn := false, false
	defer guard(&returned, func(v any) {
		if inFn {
			panic(v)
		}
		err = errPanicked("Each", v)
	}, nil)
	err = g.ls.Each(ctx, func(rec backend.Record) error {
		inFn = true
		ferr := fn(rec)
		inFn = false
		return ferr
	})
	returned = true
	return err
}

var _ backend.Stepper = guarded{}
