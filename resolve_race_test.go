package idem_test

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemtest"
)

// hookBackend wraps a MemoryBackend with hooks after Get and before Complete.
type hookBackend struct {
	*idemtest.MemoryBackend
	afterGet       func()
	beforeComplete func(rec backend.Record)
	failComplete   func(rec backend.Record) error
}

func (h *hookBackend) Get(ctx context.Context, key string, now time.Time) (backend.Record, bool, error) {
	r, ok, err := h.MemoryBackend.Get(ctx, key, now)
	if f := h.afterGet; f != nil {
		h.afterGet = nil
		f()
	}
	return r, ok, err
}

func (h *hookBackend) Complete(ctx context.Context, rec backend.Record, now time.Time, ttl time.Duration) error {
	if f := h.beforeComplete; f != nil {
		h.beforeComplete = nil
		f(rec)
	}
	if f := h.failComplete; f != nil {
		if err := f(rec); err != nil {
			return err
		}
	}
	return h.MemoryBackend.Complete(ctx, rec, now, ttl)
}

// interruptedKey leaves key interrupted in mem (claimed, then "crashed").
func interruptedKey(t *testing.T, mem *idemtest.MemoryBackend, key string) {
	t.Helper()
	s := idem.New[string](idem.Options{Backend: mem, SweepInterval: -1})
	tk, err := s.Begin(context.Background(), key, nil)
	if err != nil {
		t.Fatal(err)
	}
	_ = tk
	mem.Crash()
	// Do not Close s (it would wait for the ticket); drop it. The ticket's
	// finalizer may later try to release: its token no longer matches after
	// Resolve, harmless.
	runtime.KeepAlive(tk)
}

// Two operators resolve the same interrupted key with different outcomes at
// the same time: only one outcome can be recorded, so one of them is told
// ErrNotInterrupted, never both nil.
func TestConcurrentResolvesRecordOneOutcome(t *testing.T) {
	mem := idemtest.NewMemoryBackend()
	interruptedKey(t, mem, "m3")
	hb := &hookBackend{MemoryBackend: mem}
	opA := newStore[string](t, idem.Options{Backend: hb, SweepInterval: -1})
	opB := newStore[string](t, idem.Options{Backend: mem, SweepInterval: -1})
	var errB error
	hb.beforeComplete = func(backend.Record) { // B runs entirely inside A's Get→Complete window
		errB = opB.Resolve(context.Background(), "m3", "B", nil)
	}
	errA := opA.Resolve(context.Background(), "m3", "A", nil)
	got, err := opB.RunOnce(context.Background(), "m3", nil, func(context.Context) (string, error) { return "ran", nil })
	t.Logf("Resolve A: %v; Resolve B: %v; replayed: %q, %v", errA, errB, got, err)
	if errA == nil && errB == nil {
		t.Fatalf("both Resolves reported success, but only %q was recorded", got)
	}
}

// The owner comes back and records its real outcome between the operator's
// Get and Complete: Resolve returns ErrNotInterrupted, as documented ("its
// owner records after all"), not success for an outcome it did not record.
func TestResolveAfterOwnerCompletesIsNotInterrupted(t *testing.T) {
	clock := newFakeClock()
	mem := idemtest.NewMemoryBackend()
	var un idemtest.Unrecorded
	owner := idem.New[string](idem.Options{Backend: mem, Now: clock.Now, Lease: time.Hour, SweepInterval: -1, Observer: un.Observer()})
	tk, err := owner.Begin(context.Background(), "m3", nil)
	if err != nil {
		t.Fatal(err)
	}
	clock.Advance(2 * time.Hour) // the owner's lease lapsed by the backend's clock: interrupted
	hb := &hookBackend{MemoryBackend: mem}
	op := newStore[string](t, idem.Options{Backend: hb, Now: clock.Now, SweepInterval: -1})
	var ownerVal string
	var ownerErr error
	hb.afterGet = func() { ownerVal, ownerErr = tk.Finish("owner's real outcome", nil) }
	rerr := op.Resolve(context.Background(), "m3", "operator's outcome", nil)
	owner.Close()
	rec, _, _ := mem.Get(context.Background(), "m3", clock.Now())
	t.Logf("owner Finish: %q %v; Resolve: %v; recorded value: %s", ownerVal, ownerErr, rerr, rec.Value)
	if rerr == nil && !strings.Contains(string(rec.Value), "operator") {
		t.Fatalf("Resolve returned nil but the backend replays the owner's outcome %s; want ErrNotInterrupted", rec.Value)
	}
}

// The reverse order: the operator resolves first, then the owner (lease
// lapsed) finishes: the owner's outcome is not recorded, and the Observer
// hears so; the owner is not left believing it was.
func TestOwnerFinishAfterResolveIsToldNotRecorded(t *testing.T) {
	clock := newFakeClock()
	mem := idemtest.NewMemoryBackend()
	var un idemtest.Unrecorded
	owner := idem.New[string](idem.Options{Backend: mem, Now: clock.Now, Lease: time.Hour, SweepInterval: -1, Observer: un.Observer()})
	tk, err := owner.Begin(context.Background(), "m3", nil)
	if err != nil {
		t.Fatal(err)
	}
	clock.Advance(2 * time.Hour)
	op := newStore[string](t, idem.Options{Backend: mem, Now: clock.Now, SweepInterval: -1})
	if err := op.Resolve(context.Background(), "m3", "operator", nil); err != nil {
		t.Fatal(err)
	}
	v, ferr := tk.Finish("owner", nil)
	owner.Close()
	rec, _, _ := mem.Get(context.Background(), "m3", clock.Now())
	t.Logf("owner Finish: %q %v; recorded %s", v, ferr, rec.Value)
	if un.Of("m3") == nil && !strings.Contains(string(rec.Value), "owner") {
		t.Fatalf("owner's Finish returned (%q, %v) and no Observer heard it was not recorded, but the backend replays %s", v, ferr, rec.Value)
	}
}
