package idemgrpc_test

import (
	"testing"

	"github.com/seed094d4201/idem/internal/svctest"
)

func TestMain(m *testing.M) { svctest.Main(m) }
