package bolt

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/seed094d4201/idem/internal/svctest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// openTemp opens a Backend on a new file in a temporary directory and closes
// it when the test ends.
func openTemp(t testing.TB, opts *Options) (*Backend, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "idem.db")
	b, err := Open(path, opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	return b, path
}

func TestConformance(t *testing.T) {
	idemtest.Run(t, func(t *testing.T) backend.Backend {
		b, _ := openTemp(t, nil)
		return b
	})
}

// TestContract runs the store-level contract through RunOnce and Begin over
// a bolt file, reopening the file for the restart and crash tests.
func TestContract(t *testing.T) {
	svctest.AtOnceUnlessLong(t) // beside the package's other suite: both mostly wait on leases
	idemtest.RunContract(t, harness())
}

// harness makes bolt files for the store-level suites; a restart reopens
// the file.
func harness() idemtest.Harness {
	paths := map[backend.Backend]string{}
	return idemtest.Harness{
		Backend: func(t *testing.T) backend.Backend {
			b, path := openTemp(t, nil)
			paths[b] = path
			return b
		},
		Reopen: func(t *testing.T, b backend.Backend) backend.Backend {
			require.NoError(t, b.(*Backend).Close())
			reopened, err := Open(paths[b], nil)
			require.NoError(t, err)
			t.Cleanup(func() { _ = reopened.Close() })
			paths[reopened] = paths[b]
			return reopened
		},
		// The file's lock proves the owners of its pending claims dead.
		ReopenProvesDeath: true,
	}
}

func TestConformanceSteps(t *testing.T) {
	idemtest.RunSteps(t, func(t *testing.T) backend.Stepper {
		b, _ := openTemp(t, nil)
		return b
	})
}

// A step recorded before a crash is in the file after it, byte for byte,
// and the interrupted claim can be resumed with its steps.
func TestStepsSurviveRestart(t *testing.T) {
	b, path := openTemp(t, nil)
	ctx := context.Background()
	claim, won, err := b.Claim(ctx, backend.Record{Key: "k", Token: "dead", Fingerprint: [32]byte{7}}, time.Now(), time.Hour)
	require.NoError(t, err)
	require.True(t, won)
	value := []byte{0, 1, 2, 0xfe, 0xff, '"'}
	require.NoError(t, b.RecordStep(ctx, "k", claim.Token, backend.Step{Name: "charge", Value: value}, time.Now()))
	require.NoError(t, b.Close()) // as a crash leaves it: the claim pending

	b, err = Open(path, nil)
	require.NoError(t, err)
	defer b.Close()
	rec, ok, err := b.Get(ctx, "k", time.Now())
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, backend.StateInterrupted, rec.State)
	require.Len(t, rec.Steps, 1)
	assert.Equal(t, value, rec.Steps[0].Value)
	resumed, err := b.Resume(ctx, "k", "dead", "next", time.Now(), time.Hour)
	require.NoError(t, err)
	assert.Equal(t, value, resumed.Steps[0].Value)
	assert.Equal(t, [32]byte{7}, resumed.Fingerprint)
}

// TestModel drives two stores over one bolt file with idemtest's random
// model; a crash reopens the file.
func TestModel(t *testing.T) {
	svctest.AtOnceUnlessLong(t) // beside the package's other suite: both mostly wait on leases
	idemtest.RunModel(t, harness())
}
