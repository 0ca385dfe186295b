package idemtest_test

import (
	"testing"

	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/seed094d4201/idem/internal/svctest"
)

func TestContractMemoryOnly(t *testing.T) {
	idemtest.RunContract(t, idemtest.Harness{
		Backend: func(*testing.T) backend.Backend { return nil },
	})
}

func TestContractMemoryBackend(t *testing.T) {
	svctest.AtOnceUnlessLong(t) // beside the models: all mostly wait on the real clock
	idemtest.RunContract(t, idemtest.Harness{
		Backend: func(*testing.T) backend.Backend { return idemtest.NewMemoryBackend() },
		// A MemoryBackend outlives its stores; Crash makes it look as a
		// durable backend does when reopened after its process died.
		Reopen: func(_ *testing.T, b backend.Backend) backend.Backend {
			b.(*idemtest.MemoryBackend).Crash()
			return b
		},
		ReopenProvesDeath: true,
	})
}
