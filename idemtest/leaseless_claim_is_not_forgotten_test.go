package idemtest_test

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemtest"
)

// leaselessForgetter's Forget deletes a pending claim that has no lease,
// as one that judged "lease_until <= now" alone would (NULL, or zero,
// taken for an instant long past): the claim of an owner still at work is
// gone, and the next Claim of its key wins a second time.
type leaselessForgetter struct{ *idemtest.MemoryBackend }

func (b leaselessForgetter) Forget(ctx context.Context, key string, now time.Time) error {
	err := b.MemoryBackend.Forget(ctx, key, now)
	if rec, ok, _ := b.MemoryBackend.Get(ctx, key, now); errors.Is(err, backend.ErrInProgress) && ok && rec.LeaseUntil.IsZero() {
		return b.MemoryBackend.Release(ctx, key, rec.Token)
	}
	return err
}

// Run fails a backend whose Forget deletes a pending claim with no lease
// (backend.Record.Live: one "that has no lease" holds). It passed such a
// backend before.
func TestConformanceFailsAForgetOfALeaselessClaim(t *testing.T) {
	if os.Getenv("IDEMTEST_LEASELESS_FORGOTTEN") != "" {
		idemtest.Run(t, func(*testing.T) backend.Backend { return leaselessForgetter{idemtest.NewMemoryBackend()} })
		return
	}
	suiteFails(t, "TestConformanceFailsAForgetOfALeaselessClaim", "IDEMTEST_LEASELESS_FORGOTTEN", "GetAndForget")
}
