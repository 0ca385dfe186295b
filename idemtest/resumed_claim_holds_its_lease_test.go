package idemtest_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemtest"
)

// leaselessResumer takes an interrupted claim over with no lease, whatever
// the lease asked: a resumer that dies then leaves its key pending for
// good, which Forget refuses (ErrInProgress) and no lapse ever frees.
type leaselessResumer struct{ *idemtest.MemoryBackend }

func (b leaselessResumer) Resume(ctx context.Context, key, old, token string, now time.Time, _ time.Duration) (backend.Record, error) {
	return b.MemoryBackend.Resume(ctx, key, old, token, now, 0)
}

// RunSteps fails a backend whose Resume ignores the lease it is given. It
// passed such a backend before.
func TestConformanceStepsFailsAResumeWithoutItsLease(t *testing.T) {
	if os.Getenv("IDEMTEST_RESUME_LEASELESS") != "" {
		idemtest.RunSteps(t, func(*testing.T) backend.Stepper { return leaselessResumer{idemtest.NewMemoryBackend()} })
		return
	}
	suiteFails(t, "TestConformanceStepsFailsAResumeWithoutItsLease", "IDEMTEST_RESUME_LEASELESS", "ResumedClaimHoldsItsLease")
}
