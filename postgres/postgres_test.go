package postgres

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/seed094d4201/idem/internal/svctest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// testPool connects to the PostgreSQL svctest.Postgres finds, or skips the
// test when there is none (fails it, in CI).
func testPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	dsn := svctest.Postgres(t)
	pool, err := pgxpool.New(context.Background(), dsn)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// testBackend returns a Backend over a table of its own, dropped when the
// test ends.
func testBackend(t testing.TB, pool *pgxpool.Pool) (*Backend, string) {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	table := "idem_test_" + hex.EncodeToString(b[:])
	be, err := New(context.Background(), pool, Options{Table: table})
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+table) })
	return be, table
}

func TestConformance(t *testing.T) {
	pool := testPool(t)
	idemtest.RunShared(t, func(t *testing.T) backend.Backend {
		b, _ := testBackend(t, pool)
		return b
	})
}

func TestSchemaFileMatchesNew(t *testing.T) {
	normalize := func(s string) string {
		var lines []string
		for _, l := range strings.Split(s, "\n") {
			if i := strings.Index(l, "--"); i >= 0 {
				l = l[:i]
			}
			if l = strings.Join(strings.Fields(l), " "); l != "" {
				lines = append(lines, l)
			}
		}
		return strings.Join(lines, "\n")
	}
	assert.Equal(t, normalize(Schema), normalize(createSQL("idem_keys", "idem_keys_sweep")))
}

// Replicas that start together all migrate a fresh table at once: every New
// succeeds (CREATE ... IF NOT EXISTS alone collides in the catalog).
func TestConcurrentNewOnFreshTable(t *testing.T) {
	testPool(t) // or skip
	cfg, err := pgxpool.ParseConfig(svctest.Postgres(t))
	require.NoError(t, err)
	cfg.MaxConns = 16 // one session per replica, all at once
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	for round := range 3 {
		table := fmt.Sprintf("idem_migrate_%d_%d", time.Now().UnixNano(), round)
		t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+table) })
		const replicas = 16
		start := make(chan struct{})
		errs := make(chan error, replicas)
		for range replicas {
			go func() {
				<-start
				_, err := New(context.Background(), pool, Options{Table: table})
				errs <- err
			}()
		}
		close(start)
		for range replicas {
			assert.NoError(t, <-errs)
		}
	}
}

// TestContract runs the store-level contract through RunOnce and Begin over
// a table of its own; leases and expiry go by the server's clock.
func TestContract(t *testing.T) {
	svctest.AtOnceUnlessLong(t) // beside the package's other suite: both mostly wait on leases
	idemtest.RunContract(t, harness(testPool(t)))
}

// harness makes tables in pool for the store-level suites; a restart is a
// new Backend over the same table, as a new process makes.
func harness(pool *pgxpool.Pool) idemtest.Harness {
	tables := map[backend.Backend]string{}
	return idemtest.Harness{
		Backend: func(t *testing.T) backend.Backend {
			b, table := testBackend(t, pool)
			tables[b] = table
			return b
		},
		Reopen: func(t *testing.T, b backend.Backend) backend.Backend {
			reopened, err := New(context.Background(), pool, Options{Table: tables[b]})
			require.NoError(t, err)
			tables[reopened] = tables[b]
			return reopened
		},
		ServerClock: true,
	}
}

// TestModel drives two stores over one table with idemtest's random
// model, on the server's clock; a crash is a new Backend over the table.
func TestModel(t *testing.T) {
	svctest.AtOnceUnlessLong(t) // beside the package's other suite: both mostly wait on leases
	idemtest.RunModel(t, harness(testPool(t)))
}
