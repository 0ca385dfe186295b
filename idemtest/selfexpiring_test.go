package idemtest

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/seed094d4201/idem/backend"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// keepsExpired hides expired records on read, as MemoryBackend does, but
// never deletes them, and says its records expire by themselves: a
// backend lying about backend.SelfExpiring.
type keepsExpired struct{ *MemoryBackend }

func (keepsExpired) ExpiresRecords() {}
func (k keepsExpired) Sweep(ctx context.Context, _ time.Time, _ int) (int, error) {
	return 0, k.refuse(ctx)
}

const selfExpiringChildEnv = "IDEMTEST_SELF_EXPIRING_CHILD"

// TestSelfExpiringLiarChild runs the suite against keepsExpired, in the
// child process TestSuiteCatchesASelfExpiringLiar starts.
func TestSelfExpiringLiarChild(t *testing.T) {
	if os.Getenv(selfExpiringChildEnv) == "" {
		t.Skip("run by TestSuiteCatchesASelfExpiringLiar")
	}
	Run(t, func(t *testing.T) backend.Backend { return keepsExpired{NewMemoryBackend()} })
}

// A backend that declares SelfExpiring and keeps its expired records
// fails the suite: the declaration excuses Sweep's counts, not records
// that never go (the whole suite once passed such a backend).
func TestSuiteCatchesASelfExpiringLiar(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^TestSelfExpiringLiarChild$/SweepDeletesExpiredOnly$")
	cmd.Env = append(os.Environ(), selfExpiringChildEnv+"=1")
	out, err := cmd.CombinedOutput()
	require.Error(t, err, "the suite passed a SelfExpiring backend that never deletes:\n%s", out)
	assert.True(t, strings.Contains(string(out), "gone without a Sweep"), "it failed for another reason:\n%s", out)
}
