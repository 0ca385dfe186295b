package idemqueue_test

import (
	"testing"

	"github.com/seed094d4201/idem/internal/svctest"
)

// The PostgreSQL and MySQL tests skip without their service; the package's
// output ends with one line saying so (internal/svctest).
func TestMain(m *testing.M) { svctest.Main(m) }
