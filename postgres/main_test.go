package postgres

import (
	"testing"

	"github.com/seed094d4201/idem/internal/svctest"
)

// TestMain finds the services the tests need (internal/svctest) and ends
// with one line saying what was skipped and why.
func TestMain(m *testing.M) { svctest.Main(m) }
