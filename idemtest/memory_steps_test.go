package idemtest_test

import (
	"testing"

	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemtest"
)

func TestMemoryBackendSteps(t *testing.T) {
	idemtest.RunSteps(t, func(t *testing.T) backend.Stepper { return idemtest.NewMemoryBackend() })
}
