package idem_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemtest"
)

// crossGet answers a Get of "k" with the record of "x": a broken Backend.
type crossGet struct{ backend.Backend }

func (c crossGet) Get(ctx context.Context, key string, now time.Time) (backend.Record, bool, error) {
	if key == "k" {
		key = "x"
	}
	return c.Backend.Get(ctx, key, now)
}

// A Get answered with another key's record is the Backend's failure, as a
// Claim or a Resume answered so is: Resolve of k does not write its
// outcome into x's record, nor does a call that finds memory full replay
// x's outcome for k.
func TestAGetAnsweredWithAnotherKeysRecordIsABackendFailure(t *testing.T) {
	mem := idemtest.NewMemoryBackend()
	fp := mustFingerprint(t, "p")
	past := time.Now().Add(-time.Hour)
	if _, _, err := mem.Claim(context.Background(), backend.Record{Key: "x", Token: "tx", Fingerprint: fp, State: backend.StatePending}, past, time.Second); err != nil {
		t.Fatal(err)
	}
	s := idem.New[int](idem.Options{Backend: crossGet{mem}, SweepInterval: -1, MaxKeys: 1})
	defer closeWithin(t, s, 5*time.Second)
	var be *idem.BackendError
	if err := s.Resolve(context.Background(), "k", 7, nil); !errors.As(err, &be) {
		t.Errorf("Resolve(k) with x's record for k's = %v, want a *BackendError", err)
	}
	if rec, _, _ := mem.Get(context.Background(), "x", time.Now()); rec.State == backend.StateCompleted {
		t.Fatal("Resolve of k wrote its outcome into x's record")
	}

	// x completed; memory full: a call of k must not replay x's outcome.
	if err := mem.Complete(context.Background(), backend.Record{Key: "x", Token: "tx", Fingerprint: fp, State: backend.StateCompleted, Value: []byte("1")}, time.Now(), time.Hour); err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	defer close(release)
	started := make(chan struct{})
	go func() {
		_, _ = s.RunOnce(context.Background(), "full", "p", func(context.Context) (int, error) {
			close(started)
			<-release
			return 0, nil
		})
	}()
	<-started
	v, err := s.RunOnce(context.Background(), "k", "p", func(context.Context) (int, error) { return 2, nil })
	if !errors.As(err, &be) {
		t.Errorf("a call of k on a full store = %d, %v; want a *BackendError, not x's outcome", v, err)
	}
}
