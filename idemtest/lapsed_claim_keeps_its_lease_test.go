package idemtest_test

import (
	"context"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/stretchr/testify/assert"
)

// suiteFails runs test (this binary's test of that name) in a child
// process with env set, where it runs a conformance suite over a backend
// that breaks one rule, and checks that the suite failed it in subtest.
func suiteFails(t *testing.T, test, env, subtest string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+test+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), env+"=1")
	out, err := cmd.CombinedOutput()
	assert.Error(t, err, "the suite passed a backend that breaks the rule:\n%s", out)
	assert.Contains(t, string(out), "--- FAIL: "+test+"/"+subtest, "the suite failed it elsewhere, or not at all:\n%s", out)
}

// leaseDropper reports a claim interrupted by its lease's lapse with no
// LeaseUntil: as a backend would that proves its owner dead, which the
// Store then acts on at once (Resume, RetryInterrupted), though a lapse
// alone may be a clock that stepped under a live owner.
type leaseDropper struct{ *idemtest.MemoryBackend }

func (b leaseDropper) Get(ctx context.Context, key string, now time.Time) (backend.Record, bool, error) {
	rec, ok, err := b.MemoryBackend.Get(ctx, key, now)
	if rec.State == backend.StateInterrupted {
		rec.LeaseUntil = time.Time{}
	}
	return rec, ok, err
}

func (b leaseDropper) Claim(ctx context.Context, rec backend.Record, now time.Time, lease time.Duration) (backend.Record, bool, error) {
	got, won, err := b.MemoryBackend.Claim(ctx, rec, now, lease)
	if !won && got.State == backend.StateInterrupted {
		got.LeaseUntil = time.Time{}
	}
	return got, won, err
}

// Run fails a backend whose Get or Claim reports a lapsed claim without
// its LeaseUntil (backend.StateInterrupted's rule: a lapse alone is no
// proof of death). It passed such a backend before.
func TestConformanceFailsALapsedClaimReportedWithoutItsLease(t *testing.T) {
	if os.Getenv("IDEMTEST_LEASE_DROPPED") != "" {
		idemtest.Run(t, func(*testing.T) backend.Backend { return leaseDropper{idemtest.NewMemoryBackend()} })
		return
	}
	suiteFails(t, "TestConformanceFailsALapsedClaimReportedWithoutItsLease", "IDEMTEST_LEASE_DROPPED", "LapsedLeaseIsInterrupted")
}
