package idemtest_test

import (
	"testing"

	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemtest"
)

func TestMemoryBackendConformance(t *testing.T) {
	idemtest.Run(t, func(*testing.T) backend.Backend { return idemtest.NewMemoryBackend() })
}
