package idemtest_test

import (
	"testing"

	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemtest"
)

func TestModelMemoryOnly(t *testing.T) {
	t.Parallel()
	idemtest.RunModel(t, idemtest.Harness{})
}

func TestModelMemoryBackend(t *testing.T) {
	t.Parallel()
	idemtest.RunModel(t, idemtest.Harness{
		Backend: func(*testing.T) backend.Backend { return idemtest.NewMemoryBackend() },
		// A crash: every owner is dead, so their pending claims read
		// interrupted, as a reopened file's do.
		Reopen: func(_ *testing.T, b backend.Backend) backend.Backend {
			b.(*idemtest.MemoryBackend).Crash()
			return b
		},
	})
}
