package main

import (
	"strings"
	"testing"

	"github.com/seed094d4201/idem/internal/svctest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { svctest.Main(m) }

const story = `Paying three orders through a network that loses the first reply:
  order 101: 201 Created, charge 1 (a retry after the lost reply, answered from the stored response)
  order 102: 201 Created, charge 2
  order 103: 201 Created, charge 3
The ledger:
  charge 1: order 101, 450 rupees
  charge 2: order 102, 990 rupees
  charge 3: order 103, 120 rupees
One charge per order: true (the proxy dropped 1 reply)
`

// The story as `go run ./examples/payments` tells it: on a SQLite file.
func TestStory(t *testing.T) {
	var out strings.Builder
	require.NoError(t, run(&out, ""))
	assert.Equal(t, story, out.String())
}

// The same story with PAYMENTS_DB naming a PostgreSQL or a MySQL server.
func TestStoryOnAServer(t *testing.T) {
	t.Run("PostgreSQL", func(t *testing.T) {
		dsn := svctest.Postgres(t)
		if !strings.HasPrefix(dsn, "postgres://") && !strings.HasPrefix(dsn, "postgresql://") {
			t.Fatalf("IDEM_POSTGRES_DSN %q is not a postgres:// URL, which the example needs", dsn)
		}
		var out strings.Builder
		require.NoError(t, run(&out, dsn))
		assert.Equal(t, story, out.String())
	})
	t.Run("MySQL", func(t *testing.T) {
		var out strings.Builder
		require.NoError(t, run(&out, "mysql:"+svctest.MySQL(t)))
		assert.Equal(t, story, out.String())
	})
}

func TestGRPCStory(t *testing.T) {
	var out strings.Builder
	require.NoError(t, runGRPC(&out))
	assert.Equal(t, `Paying three orders over gRPC; the first reply is lost:
  order 101: charge 1 (a retry after the lost reply, answered from the stored reply)
  order 102: charge 2
  order 103: charge 3
The ledger:
  charge 1: order 101, 450 rupees
  charge 2: order 102, 990 rupees
  charge 3: order 103, 120 rupees
One charge per order: true
`, out.String())
}
