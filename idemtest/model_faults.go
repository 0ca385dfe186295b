package idemtest

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
)

// The model's faults: what a backend, a Codec or an Observer does wrong,
// injected by the driver and healed by it.

// faultKind is what an injected backend fault does to the call it hits.
type faultKind int

const (
	faultNone   faultKind = iota
	faultFail             // the call fails before it reaches the backend
	faultLose             // the call lands, its reply is lost
	faultHang             // the call waits for its ctx, then fails unsent (a refused dial)
	faultSilent           // the call waits for its ctx, then fails as a timeout: it may have landed
)

func (k faultKind) String() string {
	return [...]string{"none", "fail", "lose", "hang", "silent"}[k]
}

var (
	errInjected = errors.New("idemtest: injected fault")
	errKilled   = errors.New("idemtest: this store's process was killed")
)

// faults is the fault plan of one store's view of the backend. It is safe
// for concurrent use.
type faults struct {
	mu     sync.Mutex
	killed bool                 // guarded by mu; every call refused from then on
	once   map[string]faultKind // guarded by mu; the next call of an op
	until  map[string]bool      // guarded by mu; every call of an op fails until healed
	// The next claim this store wins has its outcome writes fail until
	// healed (markNext); tokens holds those claims, oldest first, so that
	// one execution's write can heal while a later one's still fails.
	markNext bool     // guarded by mu
	tokens   []string // guarded by mu
	silent   bool     // guarded by mu; every call waits for its ctx, then is refused
	// claimed holds the tokens of every claim this store won (a Claim, a
	// Resume), guarded by mu: the claims only it renews.
	claimed map[string]bool
}

func newFaults() *faults {
	return &faults{once: make(map[string]faultKind), until: make(map[string]bool), claimed: make(map[string]bool)}
}

func (f *faults) setOnce(op string, k faultKind) {
	f.mu.Lock()
	f.once[op] = k
	f.mu.Unlock()
}

func (f *faults) setUntil(op string) {
	f.mu.Lock()
	f.until[op] = true
	f.mu.Unlock()
}

// goSilent makes the backend a silent server for this store until
// healed: nothing it is sent lands.
func (f *faults) goSilent() {
	f.mu.Lock()
	f.silent = true
	f.mu.Unlock()
}

func (f *faults) kill() {
	f.mu.Lock()
	f.killed = true
	f.mu.Unlock()
}

// heal ends every fault but a kill.
func (f *faults) heal() {
	f.mu.Lock()
	clear(f.once)
	clear(f.until)
	f.markNext, f.tokens, f.silent = false, nil, false
	f.mu.Unlock()
}

// failNextClaim makes the outcome writes of the next claim this store
// wins fail until healed.
func (f *faults) failNextClaim() {
	f.mu.Lock()
	f.markNext = true
	f.mu.Unlock()
}

// won notes a claim this store won.
func (f *faults) won(token string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.claimed[token] = true
	if f.markNext {
		f.markNext = false
		f.tokens = append(f.tokens, token)
	}
}

// resumed notes a claim this store took over with Resume.
func (f *faults) resumed(token string) {
	f.mu.Lock()
	f.claimed[token] = true
	f.mu.Unlock()
}

// holds reports whether token is a claim this store won.
func (f *faults) holds(token string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.claimed[token]
}

// healOldest heals the oldest claim whose writes fail, and reports
// whether there was one.
func (f *faults) healOldest() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.tokens) == 0 {
		return false
	}
	f.tokens = f.tokens[1:]
	return true
}

// failsToken reports whether token's outcome writes fail.
func (f *faults) failsToken(token string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Contains(f.tokens, token)
}

// renewalsFail reports whether this store's renewals cannot get through:
// a claim it wins now loses its lease, so an outcome it pins is not sure.
func (f *faults) renewalsFail() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.killed || f.silent || f.until["Renew"]
}

// active reports whether any fault is planned, a kill included.
func (f *faults) active() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.killed || len(f.once) > 0 || len(f.until) > 0 || f.markNext || len(f.tokens) > 0 || f.silent
}

// take returns the fault for this call of op, consuming a one-call fault.
func (f *faults) take(op string) faultKind {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case f.killed:
		return faultFail
	case f.until[op]:
		return faultFail
	case f.silent:
		return faultSilent
	}
	k := f.once[op]
	delete(f.once, op)
	return k
}

// before runs the part of a fault that comes before the call is sent.
func (f *faults) before(ctx context.Context, op string) (faultKind, error) {
	k := f.take(op)
	switch k {
	case faultFail:
		f.mu.Lock()
		killed := f.killed
		f.mu.Unlock()
		if killed {
			return k, backend.Refuse(errKilled)
		}
		return k, errInjected
	case faultHang:
		<-ctx.Done()
		return k, backend.Refuse(errInjected)
	case faultSilent:
		<-ctx.Done()
		return k, fmt.Errorf("idemtest: a silent server: %w", ctx.Err())
	}
	return k, nil
}

// faultBackend is a Backend (and, over one, a Stepper and a Lister) whose
// calls go through a store's fault plan.
type faultBackend struct {
	b backend.Backend
	f *faults
}

// faultStepper adds the Stepper and Lister methods, for a backend that has
// them, so that the store sees what the wrapped backend offers.
type faultStepper struct{ faultBackend }

var (
	_ backend.Stepper = faultStepper{}
	_ backend.Lister  = faultStepper{}
)

// wrap returns b behind the fault plan f.
func wrap(b backend.Backend, f *faults) backend.Backend {
	fb := faultBackend{b: b, f: f}
	_, steps := b.(backend.Stepper)
	_, lists := b.(backend.Lister)
	if steps && lists {
		return faultStepper{fb}
	}
	return fb
}

// do runs call under op's fault.
func (fb faultBackend) do(ctx context.Context, op string, call func() error) error {
	k, err := fb.f.before(ctx, op)
	if err != nil {
		return err
	}
	err = call()
	if k == faultLose && err == nil {
		return errInjected
	}
	return err
}

func (fb faultBackend) Claim(ctx context.Context, rec backend.Record, now time.Time, lease time.Duration) (got backend.Record, won bool, err error) {
	err = fb.do(ctx, "Claim", func() (err error) {
		got, won, err = fb.b.Claim(ctx, rec, now, lease)
		return err
	})
	if err != nil {
		return backend.Record{}, false, err
	}
	if won {
		fb.f.won(rec.Token)
	} else {
		see(ctx, got)
	}
	return got, won, nil
}

func (fb faultBackend) Complete(ctx context.Context, rec backend.Record, now time.Time, ttl time.Duration) error {
	if fb.f.failsToken(rec.Token) {
		return errInjected
	}
	return fb.do(ctx, "Complete", func() error { return fb.b.Complete(ctx, rec, now, ttl) })
}

func (fb faultBackend) Release(ctx context.Context, key, token string) error {
	return fb.do(ctx, "Release", func() error { return fb.b.Release(ctx, key, token) })
}

func (fb faultBackend) Get(ctx context.Context, key string, now time.Time) (rec backend.Record, ok bool, err error) {
	err = fb.do(ctx, "Get", func() (err error) {
		rec, ok, err = fb.b.Get(ctx, key, now)
		return err
	})
	if err != nil {
		return backend.Record{}, false, err
	}
	if ok {
		see(ctx, rec)
	}
	return rec, ok, nil
}

func (fb faultBackend) Renew(ctx context.Context, key, token string, now time.Time, lease time.Duration) error {
	return fb.do(ctx, "Renew", func() error { return fb.b.Renew(ctx, key, token, now, lease) })
}

func (fb faultBackend) Forget(ctx context.Context, key string, now time.Time) error {
	return fb.do(ctx, "Forget", func() error { return fb.b.Forget(ctx, key, now) })
}

func (fb faultBackend) Sweep(ctx context.Context, now time.Time, limit int) (n int, err error) {
	err = fb.do(ctx, "Sweep", func() (err error) {
		n, err = fb.b.Sweep(ctx, now, limit)
		return err
	})
	return n, err
}

func (fs faultStepper) RecordStep(ctx context.Context, key, token string, step backend.Step, now time.Time) error {
	return fs.do(ctx, "RecordStep", func() error {
		return fs.b.(backend.Stepper).RecordStep(ctx, key, token, step, now)
	})
}

func (fs faultStepper) Resume(ctx context.Context, key, old, token string, now time.Time, lease time.Duration) (rec backend.Record, err error) {
	err = fs.do(ctx, "Resume", func() (err error) {
		rec, err = fs.b.(backend.Stepper).Resume(ctx, key, old, token, now, lease)
		return err
	})
	if err != nil {
		return backend.Record{}, err
	}
	fs.f.resumed(token)
	return rec, nil
}

func (fs faultStepper) Each(ctx context.Context, fn func(backend.Record) error) error {
	return fs.do(ctx, "Each", func() error { return fs.b.(backend.Lister).Each(ctx, fn) })
}

// misbehaviour is what the user's code that runs inside the library (a
// Codec, an Observer) does on its next call.
type misbehaviour int

const (
	behave misbehaviour = iota
	misError
	misPanic
	misGoexit
)

func (m misbehaviour) String() string {
	return [...]string{"behave", "error", "panic", "goexit"}[m]
}

// userCode holds the next misbehaviour of a store's Codec (on Marshal)
// and Observer (on Executing and Span). It is safe for concurrent use.
type userCode struct {
	mu       sync.Mutex
	marshal  misbehaviour // guarded by mu; the next Marshal
	observer misbehaviour // guarded by mu; the next Executing or Span
	// heard, if set, hears every NotRecorded the Observer is told with
	// the call whose outcome it is, when the call is answered or later
	// (a detached execution whose caller left); set before the store opens.
	heard func(c *modelCall, nr *idem.NotRecordedError)
}

func (u *userCode) take(field *misbehaviour) misbehaviour {
	u.mu.Lock()
	defer u.mu.Unlock()
	m := *field
	*field = behave
	return m
}

func (u *userCode) pending() bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.marshal != behave || u.observer != behave
}

// misbehave does what m says, where the user's code would run.
func misbehave(m misbehaviour) error {
	switch m {
	case misError:
		return errInjected
	case misPanic:
		panic("idemtest: injected panic in the user's code")
	case misGoexit:
		runtime.Goexit()
	}
	return nil
}

// modelCodec is JSONCodec with injected misbehaviour on Marshal.
type modelCodec struct{ u *userCode }

func (c modelCodec) Marshal(v any) ([]byte, error) {
	if err := misbehave(c.u.take(&c.u.marshal)); err != nil {
		return nil, err
	}
	return idem.JSONCodec{}.Marshal(v)
}

func (c modelCodec) Unmarshal(data []byte, v any) error { return idem.JSONCodec{}.Unmarshal(data, v) }

// observer returns an Observer whose Executing, Span and NotRecorded
// misbehave as u says. A misError there has nothing to return an error to
// and is ignored. NotRecorded first tells the call whose outcome it is
// (carried by its ctx) what it heard.
func (u *userCode) observerHooks() *idem.Observer {
	hook := func() { _ = misbehave(u.take(&u.observer)) }
	return &idem.Observer{
		Executing: func(context.Context, int) { hook() },
		Span: func(ctx context.Context, _, _ string) (context.Context, func(error)) {
			hook()
			return ctx, func(error) {}
		},
		NotRecorded: func(ctx context.Context, _ string, err error) {
			var nr *idem.NotRecordedError
			if c, ok := ctx.Value(callKey{}).(*modelCall); ok && errors.As(err, &nr) {
				c.unrecorded.Store(nr)
				if u.heard != nil {
					u.heard(c, nr)
				}
			}
			hook()
		},
	}
}
