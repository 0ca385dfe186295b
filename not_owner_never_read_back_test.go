package idem_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemtest"
)

// repeatedComplete is a Backend whose Complete lands and then answers
// ErrNotOwner, as a client library's retry of a write whose first reply
// was lost does (a repeat that finds its own write done answers that),
// while every read-back fails (a large record's read that times out).
type repeatedComplete struct {
	backend.Backend
	blind atomic.Bool
}

func (r *repeatedComplete) Complete(ctx context.Context, rec backend.Record, now time.Time, ttl time.Duration) error {
	if err := r.Backend.Complete(ctx, rec, now, ttl); err != nil {
		return err
	}
	r.blind.Store(true)
	return fmt.Errorf("%w: key %q", backend.ErrNotOwner, rec.Key)
}

func (r *repeatedComplete) Get(ctx context.Context, key string, now time.Time) (backend.Record, bool, error) {
	if r.blind.Load() {
		return backend.Record{}, false, errors.New("i/o timeout")
	}
	return r.Backend.Get(ctx, key, now)
}

// A write that answers ErrNotOwner is a lost claim only once the record
// read back says so: never read back, its fate is unknown. Resolve, whose
// outcome landed, answered that the key had changed hands
// (ErrNotInterrupted); it now answers the Backend's failure.
func TestANotOwnerNeverReadBackIsNoLostClaim(t *testing.T) {
	mem := idemtest.NewMemoryBackend()
	past := time.Now().Add(-time.Hour) // an interrupted claim: its owner gone long ago
	if _, _, err := mem.Claim(context.Background(), backend.Record{Key: "k", Fingerprint: mustFingerprint(t, "p"), Token: "dead", State: backend.StatePending}, past, time.Second); err != nil {
		t.Fatal(err)
	}
	s := idem.New[int](idem.Options{Backend: &repeatedComplete{Backend: mem}, SettleTimeout: 50 * time.Millisecond, SweepInterval: -1})
	defer closeWithin(t, s, 5*time.Second)
	err := s.Resolve(context.Background(), "k", 7, nil)
	var be *idem.BackendError
	if errors.Is(err, idem.ErrNotInterrupted) || !errors.As(err, &be) {
		t.Errorf("Resolve whose write landed and answered ErrNotOwner, never read back = %v, want a *BackendError", err)
	}
	if rec, _, _ := mem.Get(context.Background(), "k", time.Now()); rec.State != backend.StateCompleted {
		t.Fatalf("the resolved outcome did not land: %v", rec.State)
	}
}
