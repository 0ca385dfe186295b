package idem

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/seed094d4201/idem/backend"
)

// ErrNoOperation is returned by Step called with a context that belongs to
// no operation: neither RunOnce's fn's nor a Ticket's.
var ErrNoOperation = errors.New("idem: Step outside an operation (use the ctx RunOnce gives fn, or Ticket.Context)")

// An operation is what Step, StepKey and OperationKey know of the
// execution a context belongs to. The Store makes one for every execution
// it owns and puts it in the execution's context.
type operation struct {
	key   string
	codec Codec

	mu       sync.Mutex
	steps    map[string]backend.Step // guarded by mu; recorded, or resumed with the claim
	done     map[string]*stepCall    // guarded by mu; this run's steps, finished or running
	recorded bool                    // guarded by mu; whether the claim holds a step
	ended    atomic.Bool             // set as the operation is settled: no step starts after
	// record records a step durably under the claim, fenced by its token;
	// nil when steps are not recorded (no Stepper, or Options.Resume off).
	record func(ctx context.Context, s backend.Step) error

	// ctx is the execution's context, which carries the operation: kept
	// in it so that a new key pays for one object, not two.
	ctx opContext
}

// An opContext is its parent with op under operationKey, as
// context.WithValue would make it. Everything else (deadline,
// cancellation, the other values) is its parent's, so that the context
// package still finds a cancellable parent through it without a goroutine.
type opContext struct {
	context.Context
	op *operation
}

func (c *opContext) Value(key any) any {
	if _, ok := key.(operationKey); ok {
		return c.op
	}
	return c.Context.Value(key)
}

func (c *opContext) String() string { return "idem.operation" }

// A stepCall is one step of this run: the first call of a name runs it,
// and the others wait for it (as with singleflight) and share its outcome.
type stepCall struct {
	ready chan struct{} // closed once val and err are set
	val   any
	err   error
}

type operationKey struct{}
type stepFrameKey struct{}

// A stepFrame is the step a context runs in, in the context Step gives its
// fn: its operation, its name, and the step it was called from, if any.
type stepFrame struct {
	op     *operation
	name   string
	parent *stepFrame
}

// within reports whether a context in frame f runs inside op's step name.
func (f *stepFrame) within(op *operation, name string) bool {
	for ; f != nil; f = f.parent {
		if f.op == op && f.name == name {
			return true
		}
	}
	return false
}

// end marks op as settled: a Step called after it (from a goroutine fn
// left running) must not run, since the key may already be another run's.
func (op *operation) end() { op.ended.Store(true) }

// withOperation returns ctx carrying a new operation for key.
func (s *Store[R]) withOperation(ctx context.Context, key string) (context.Context, *operation) {
	op := &operation{key: key, codec: s.opts.Codec}
	op.ctx = opContext{Context: ctx, op: op}
	return &op.ctx, op
}

// resumeWith lets op record steps under claim, each write bounded by
// settle and by the store's closing (stopping), and gives it the steps
// claim holds from an earlier run.
func (op *operation) resumeWith(st backend.Stepper, claim backend.Record, now func() time.Time, lease, settle time.Duration, stopping context.Context) {
	op.mu.Lock()
	defer op.mu.Unlock()
	op.record = func(ctx context.Context, s backend.Step) error {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settle)
		defer cancel()
		defer context.AfterFunc(stopping, cancel)()
		return recordStep(ctx, st, claim, s, now, lease)
	}
	for _, s := range claim.Steps {
		if op.steps == nil {
			op.steps = make(map[string]backend.Step)
		}
		op.steps[s.Name] = s
		op.recorded = true
	}
}

// recordStep records s under claim until ctx ends. A failed write may
// have landed (its reply lost): the record is read back, and the step is
// recorded if the claim holds it, so that a step that landed is never
// reported lost (its run would fail, release the claim with the step, and
// the next run would do the step's effect again). RecordStep replaces a
// step of the same name, so writing it again is safe.
//
// A RecordStep refused because the claim's lease reads as lapsed is no
// proof the claim is lost (owner.go): the backend's clock may have
// stepped forward past a live owner's lease. The claim is renewed under
// its token, which renews a lapsed lease still held by it and fails for
// a claim another store took over, and the step written again, once;
// otherwise a step whose effect is done would be reported lost, and the
// next run would do its effect again.
func recordStep(ctx context.Context, st backend.Stepper, claim backend.Record, s backend.Step, now func() time.Time, lease time.Duration) error {
	wait := settleMin
	renewed := false
	for {
		err := st.RecordStep(ctx, claim.Key, claim.Token, s, now())
		if errors.Is(err, backend.ErrNotOwner) && !renewed {
			renewed = true
			if st.Renew(ctx, claim.Key, claim.Token, now(), lease) == nil {
				continue
			}
		}
		if err == nil || refused(err) || errors.Is(err, backend.ErrNotOwner) {
			return err
		}
		rec, found, gerr := st.Get(ctx, claim.Key, now())
		switch {
		case gerr != nil:
		case !found || rec.Token != claim.Token:
			return fmt.Errorf("%w (%w)", backend.ErrNotOwner, err)
		case slices.ContainsFunc(rec.Steps, func(got backend.Step) bool { return got.Name == s.Name && bytes.Equal(got.Value, s.Value) }):
			return nil
		}
		if !pause(ctx.Done(), wait) {
			return err
		}
		wait = min(2*wait, settleMax)
	}
}

// hasSteps reports whether the operation's claim holds a recorded step.
func (op *operation) hasSteps() bool {
	op.mu.Lock()
	defer op.mu.Unlock()
	return op.recorded
}

// mayHoldStep notes that the claim may hold a step: one whose write's
// fate is unknown.
func (op *operation) mayHoldStep() {
	op.mu.Lock()
	op.recorded = true
	op.mu.Unlock()
}

// errStepExited is what the other callers of a step get when its fn ended
// its goroutine (runtime.Goexit) instead of returning.
var errStepExited = errors.New("idem: the step's fn exited its goroutine")

// errEmptyStepName is returned by Step for the name "", whose StepKey would
// be the operation's own.
var errEmptyStepName = errors.New("idem: a step needs a name")

// errOperationEnded is returned by Step called after its operation was
// settled, by a goroutine its fn left running: fn is not called.
var errOperationEnded = errors.New("idem: Step after its operation ended; fn did not run")

// Step runs fn as the step called name of the operation ctx belongs to (the
// ctx RunOnce gives its fn, or a Ticket's Context) and returns its outcome.
//
// With a Store whose Options.Resume is set and whose Backend records steps
// (backend.Stepper: bolt, sqlite, postgres, mysql, redis), the step's success, or
// an error marked Final, is recorded durably under the operation's key,
// fenced by its claim's token, before Step returns. When the operation
// runs again (its process died, or it failed with an ordinary error after
// a step), a recorded step returns its recorded outcome, decoded with the
// Store's Codec, without calling fn; the step that was running when the
// operation stopped runs again, with the same StepKey. An ordinary error
// from fn is returned and not recorded. Without Resume or a Stepper, Step
// calls fn once per run of the operation and records nothing; so too
// inside a transactional mode's fn (RunOnceTx, beginLocal), whose work
// commits all at once or not at all.
//
// A name is one step: a second call of a name in one run, even at the same
// time from another goroutine, waits for the first and returns its
// outcome. If the step's outcome cannot be recorded (the claim was lost to
// another owner, the backend failed for Options.SettleTimeout, the store
// closed), Step returns fn's result with an error: the operation should
// fail, and its next run runs the step again. A step not yet recorded does
// not start once ctx has ended (the claim's lease lost, the execution timed
// out): Step returns ctx's cause, and fn does not run.
func Step[T any](ctx context.Context, name string, fn func(ctx context.Context) (T, error)) (T, error) {
	var zero T
	if ctx == nil {
		return zero, errNilContext
	}
	op, _ := ctx.Value(operationKey{}).(*operation)
	frame, _ := ctx.Value(stepFrameKey{}).(*stepFrame)
	switch {
	case op == nil:
		return zero, ErrNoOperation
	case fn == nil:
		return zero, errNilFunc
	case name == "":
		return zero, errEmptyStepName
	case frame.within(op, name):
		return zero, fmt.Errorf("idem: step %q called from inside itself", name)
	}
	if op.ended.Load() {
		return zero, errOperationEnded
	}
	op.mu.Lock()
	if c, ok := op.done[name]; ok { // this run's: wait for it, for as long as the operation runs
		op.mu.Unlock()
		select {
		case <-c.ready:
		case <-ctx.Done():
			return zero, fmt.Errorf("idem: waiting for step %q: %w", name, context.Cause(ctx))
		}
		val, ok := c.val.(T)
		if !ok && c.val != nil {
			return zero, fmt.Errorf("idem: step %q was called with %T before, not %T", name, c.val, zero)
		}
		return val, c.err
	}
	s, recorded := op.steps[name]
	if !recorded && ctx.Err() != nil {
		// The lease lost (another owner may run this very step now), the
		// execution timed out: no new effect starts. A recorded step
		// still answers, since it does nothing.
		op.mu.Unlock()
		return zero, fmt.Errorf("idem: step %q not started: %w", name, context.Cause(ctx))
	}
	c := &stepCall{ready: make(chan struct{})}
	if op.done == nil {
		op.done = make(map[string]*stepCall)
	}
	op.done[name] = c
	record := op.record
	op.mu.Unlock()

	val, err := zero, error(nil)
	returned := false
	// Even if fn panics or exits, the waiters hear of it. A panic in fn is
	// not a step's outcome: it goes on up, as from the operation's own code.
	defer func() {
		if returned {
			c.val, c.err = val, err
			close(c.ready)
		}
	}()
	defer guard(&returned, func(p any) {
		c.val, c.err = zero, &PanicError{Value: p}
		close(c.ready)
		panic(p)
	}, func() {
		c.val, c.err = zero, errStepExited
		close(c.ready)
	})
	if recorded {
		val, err = decodeStep[T](op.codec, s)
		returned = true
		return val, err
	}
	val, err = fn(context.WithValue(ctx, stepFrameKey{}, &stepFrame{op: op, name: name, parent: frame}))
	returned = true
	if err != nil {
		err = checkedError(err) // its methods are the user's code, as the work's error's are
	}
	if !isFinalOutcome(err) || record == nil {
		return val, err
	}
	s = backend.Step{Name: name, Failed: err != nil}
	if err != nil {
		s.ErrMsg = err.Error()
	}
	enc, eerr := marshal(op.codec, val, fmt.Sprintf("step %q", name))
	if eerr != nil {
		err = errors.Join(err, eerr)
		return val, err
	}
	s.Value = enc
	// A write that failed with neither a refusal nor a lost claim (a
	// lost reply whose read-back failed too), or whose Backend ended the
	// goroutine (runtime.Goexit), leaves the step's fate unknown: it may
	// have landed. The claim then counts as holding a step, so that the
	// failed run keeps it at its recovery point (letGo) rather than
	// release it, step and all, for the next run to do the step's effect
	// again.
	written := false
	defer exiting(&written, op.mayHoldStep)
	rerr := record(ctx, s)
	written = true
	if rerr != nil && !refused(rerr) && !errors.Is(rerr, backend.ErrNotOwner) {
		op.mayHoldStep()
	}
	if rerr != nil {
		err = errors.Join(err, fmt.Errorf("idem: recording step %q: %w", name, rerr))
		return val, err
	}
	op.mu.Lock()
	op.recorded = true
	op.mu.Unlock()
	return val, err
}

// decodeStep returns a recorded step's outcome.
func decodeStep[T any](codec Codec, s backend.Step) (T, error) {
	var val T
	if len(s.Value) > 0 {
		if err := unmarshal(codec, s.Value, &val); err != nil {
			return val, fmt.Errorf("idem: decoding step %q: %w", s.Name, err)
		}
	}
	if s.Failed {
		return val, Final(errors.New(s.ErrMsg))
	}
	return val, nil
}

// OperationKey returns a key derived from the key of the operation ctx
// belongs to (which, for idemhttp, includes the client's scope): the same
// on every run of the operation, different for every key, and safe to send
// to another service as its idempotency key. It is "" outside an
// operation.
func OperationKey(ctx context.Context) string {
	if ctx == nil {
		return ""
	}
	op, _ := ctx.Value(operationKey{}).(*operation)
	if op == nil {
		return ""
	}
	return derivedKey(op.key, "")
}

// StepKey returns a key derived from the operation's key and the name of
// the step whose ctx it is (the ctx Step gives fn): the same on every run
// of the operation, so that a step run again after a crash sends the same
// key to the service it calls, which then recognises the repeat. It is
// OperationKey outside a step, and "" outside an operation.
func StepKey(ctx context.Context) string {
	if ctx == nil {
		return ""
	}
	op, _ := ctx.Value(operationKey{}).(*operation)
	if op == nil {
		return ""
	}
	// Only a step of this operation names the key: inside an operation
	// nested in another's step, the outer step is not this one's.
	name := ""
	if f, _ := ctx.Value(stepFrameKey{}).(*stepFrame); f != nil && f.op == op {
		name = f.name
	}
	return derivedKey(op.key, name)
}

// derivedKey is a UUID-shaped key (hex of 16 bytes of SHA-256) of key and
// step: fixed length whatever the key, and of characters every service
// accepts in a key.
func derivedKey(key, step string) string {
	h := sha256.New()
	h.Write([]byte("idem derived key\x00"))
	h.Write([]byte(key))
	h.Write([]byte{0})
	h.Write([]byte(step))
	var sum [sha256.Size]byte
	b := h.Sum(sum[:0])
	x := hex.EncodeToString(b[:16])
	return x[:8] + "-" + x[8:12] + "-" + x[12:16] + "-" + x[16:20] + "-" + x[20:32]
}
