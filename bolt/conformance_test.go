package bolt

import (
	"path/filepath"
	"testing"

	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemtest"
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
	paths := map[backend.Backend]string{}
	idemtest.RunContract(t, idemtest.Harness{
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
	})
}
