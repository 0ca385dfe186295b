package mysql

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/seed094d4201/idem/internal/svctest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	_ "github.com/go-sql-driver/mysql"
)

// testDSN is the DSN svctest.MySQL finds; the test is skipped when there is
// none (failed, in CI).
func testDSN(t testing.TB) string {
	t.Helper()
	dsn := svctest.MySQL(t)
	return dsn
}

// testDB opens the database IDEM_MYSQL_DSN names, with params added to
// the DSN ("interpolateParams=true").
func testDB(t testing.TB, params ...string) *sql.DB {
	t.Helper()
	dsn := testDSN(t)
	for _, p := range params {
		if strings.Contains(dsn, "?") {
			dsn += "&" + p
		} else {
			dsn += "?" + p
		}
	}
	db, err := sql.Open("mysql", dsn)
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	require.NoError(t, db.PingContext(context.Background()), "IDEM_MYSQL_DSN=%s", dsn)
	return db
}

// tableName is a fresh table name, dropped when the test ends.
func tableName(t testing.TB, db *sql.DB) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	table := "idem_test_" + hex.EncodeToString(b[:])
	t.Cleanup(func() { _, _ = db.Exec("DROP TABLE IF EXISTS " + table) })
	return table
}

// testBackend returns a Backend over a table of its own, dropped when the
// test ends.
func testBackend(t testing.TB, db *sql.DB) (*Backend, string) {
	t.Helper()
	table := tableName(t, db)
	be, err := New(context.Background(), db, Options{Table: table})
	require.NoError(t, err)
	return be, table
}

// shapes are the claim's two ways: MariaDB's INSERT ... RETURNING, and
// the insert alone, read back if it met a record, MySQL 8's only way,
// which MariaDB runs as well. A Backend on MariaDB chooses between them
// (claimMix); each shape pins one.
var shapes = []shape{{"Returning", true}, {"InsertThenSelect", false}}

type shape struct {
	name      string
	returning bool
}

// apply makes b claim in this shape only.
func (s shape) apply(b *Backend) {
	b.returning = b.returning && s.returning
	b.mix.pinned = true
	if b.returning {
		b.mix.met.Store(mixOne)
	}
}

func TestConformance(t *testing.T) {
	db := testDB(t)
	for _, shape := range shapes {
		t.Run(shape.name, func(t *testing.T) {
			idemtest.RunShared(t, func(t *testing.T) backend.Backend {
				b, _ := testBackend(t, db)
				shape.apply(b)
				return b
			})
		})
	}
}

// The same, with the driver sending each statement as one query.
func TestConformanceInterpolated(t *testing.T) {
	db := testDB(t, "interpolateParams=true")
	idemtest.Run(t, func(t *testing.T) backend.Backend {
		b, _ := testBackend(t, db)
		return b
	})
}

func TestConformanceSteps(t *testing.T) {
	db := testDB(t)
	idemtest.RunSteps(t, func(t *testing.T) backend.Stepper {
		b, _ := testBackend(t, db)
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
	assert.Equal(t, normalize(Schema), normalize(createTableSQL("`idem_keys`")))
}

// TestContract runs the store-level contract through RunOnce and Begin over
// a table of its own; leases and expiry go by the server's clock.
func TestContract(t *testing.T) {
	svctest.AtOnceUnlessLong(t) // beside the package's other suite: both mostly wait on leases
	idemtest.RunContract(t, harness(testDB(t)))
}

// harness makes tables in db for the store-level suites; a restart is a
// new Backend over the same table, as a new process makes.
func harness(db *sql.DB) idemtest.Harness {
	tables := map[backend.Backend]string{}
	return idemtest.Harness{
		Backend: func(t *testing.T) backend.Backend {
			b, table := testBackend(t, db)
			tables[b] = table
			return b
		},
		Reopen: func(t *testing.T, b backend.Backend) backend.Backend {
			reopened, err := New(context.Background(), db, Options{Table: tables[b]})
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
	idemtest.RunModel(t, harness(testDB(t)))
}

// A claim whose lease lapses before the claim is read back (MySQL 8's
// SELECT after its INSERT, a round trip later than a lease of 1 µs) is
// still the caller's: its token, not its lease, says so. Seen in CI: the
// conformance suite's 900 µs lease on a loaded machine.
func TestClaimReadBackAfterItsLeaseLapsed(t *testing.T) {
	db := testDB(t)
	for _, shape := range shapes {
		t.Run(shape.name, func(t *testing.T) {
			b, _ := testBackend(t, db)
			shape.apply(b)
			req := backend.Record{Key: "k", Token: "t1", State: backend.StatePending}
			got, won, err := b.Claim(context.Background(), req, time.Time{}, time.Microsecond)
			require.NoError(t, err)
			assert.True(t, won, "the insert landed: the claim is this caller's")
			assert.Equal(t, backend.StatePending, got.State)
			assert.Equal(t, "t1", got.Token)

			// Another request meets it as interrupted, and does not win.
			other := backend.Record{Key: "k", Token: "t2", State: backend.StatePending}
			got, won, err = b.Claim(context.Background(), other, time.Time{}, time.Minute)
			require.NoError(t, err)
			assert.False(t, won)
			assert.Equal(t, backend.StateInterrupted, got.State)
		})
	}
}
