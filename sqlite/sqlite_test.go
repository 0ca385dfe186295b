package sqlite

import (
	"context"
	"database/sql"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/seed094d4201/idem/internal/svctest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// openTemp opens a database in a new file of a temporary directory, closed
// when the test ends.
func openTemp(t testing.TB) (*sql.DB, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "idem.db")
	db, err := Open(path)
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	return db, path
}

// testBackend returns a Backend over a new file.
func testBackend(t testing.TB) (*Backend, string) {
	t.Helper()
	db, path := openTemp(t)
	b, err := New(context.Background(), db, Options{})
	require.NoError(t, err)
	return b, path
}

func TestConformance(t *testing.T) {
	idemtest.Run(t, func(t *testing.T) backend.Backend {
		b, _ := testBackend(t)
		return b
	})
}

// TestContract runs the store-level contract through RunOnce and Begin.
func TestContract(t *testing.T) {
	svctest.AtOnceUnlessLong(t) // beside the package's other suite: both mostly wait on leases
	idemtest.RunContract(t, harness())
}

// TestModel drives two stores over one SQLite file with idemtest's random
// model.
func TestModel(t *testing.T) {
	svctest.AtOnceUnlessLong(t) // beside the package's other suite: both mostly wait on leases
	idemtest.RunModel(t, harness())
}

// harness makes SQLite files for the store-level suites; a restart (a
// crash) is a new *sql.DB and Backend over the same file, as a new process
// makes.
func harness() idemtest.Harness {
	paths := map[backend.Backend]string{}
	return idemtest.Harness{
		Backend: func(t *testing.T) backend.Backend {
			b, path := testBackend(t)
			paths[b] = path
			return b
		},
		Reopen: func(t *testing.T, b backend.Backend) backend.Backend {
			require.NoError(t, b.(*Backend).db.Close())
			db, err := Open(paths[b])
			require.NoError(t, err)
			t.Cleanup(func() { _ = db.Close() })
			reopened, err := New(context.Background(), db, Options{})
			require.NoError(t, err)
			paths[reopened] = paths[b]
			return reopened
		},
	}
}

func TestSchemaFileMatchesNew(t *testing.T) {
	normalize := func(s string) string {
		var lines []string
		for _, l := range strings.Split(s, "\n") {
			if i := strings.Index(l, "--"); i >= 0 {
				l = l[:i]
			}
			l = strings.ReplaceAll(l, `"`, "") // New quotes the names
			if l = strings.Join(strings.Fields(l), " "); l != "" {
				lines = append(lines, l)
			}
		}
		return strings.Join(lines, "\n")
	}
	assert.Equal(t, normalize(Schema), normalize(createSQL(`"idem_keys"`, `"idem_keys_expiry"`)))
}

// Open sets up every connection as its doc says: WAL, fsync at every
// commit, the busy timeout, foreign keys.
func TestOpenSettings(t *testing.T) {
	db, _ := openTemp(t)
	db.SetMaxOpenConns(3)
	conns := make([]*sql.Conn, 3) // held at once, so that each is a new connection
	for i := range conns {
		c, err := db.Conn(context.Background())
		require.NoError(t, err)
		defer c.Close()
		conns[i] = c
	}
	for _, c := range conns {
		for pragma, want := range map[string]string{"journal_mode": "wal", "synchronous": "2", "busy_timeout": "10000", "foreign_keys": "1"} {
			var got string
			require.NoError(t, c.QueryRowContext(context.Background(), "PRAGMA "+pragma).Scan(&got))
			assert.Equal(t, want, got, pragma)
		}
	}
}

// New refuses a database without a busy timeout, and a nil one.
func TestNewRefusesWhatWouldFail(t *testing.T) {
	db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "bare.db"))
	require.NoError(t, err)
	defer db.Close()
	_, err = New(context.Background(), db, Options{})
	assert.ErrorContains(t, err, "busy timeout")
	_, err = New(context.Background(), nil, Options{})
	assert.Error(t, err)
}

// Open's transactions take the write lock as they begin (_txlock=immediate),
// before their first write.
func TestOpenBeginsImmediate(t *testing.T) {
	db, path := openTemp(t)
	_, err := db.Exec(`CREATE TABLE t (x)`)
	require.NoError(t, err)
	tx, err := db.Begin()
	require.NoError(t, err)
	defer tx.Rollback()
	other, err := sql.Open("sqlite", "file:"+path) // no busy timeout: fails at once
	require.NoError(t, err)
	defer other.Close()
	_, err = other.Exec(`INSERT INTO t VALUES (1)`)
	assert.ErrorContains(t, err, "locked", "the open transaction, which wrote nothing, holds the write lock")
}

func TestConformanceSteps(t *testing.T) {
	idemtest.RunSteps(t, func(t *testing.T) backend.Stepper {
		b, _ := testBackend(t)
		return b
	})
}

// A table made before steps gets its steps column from New.
func TestNewAddsStepsColumn(t *testing.T) {
	db, _ := openTemp(t)
	old := strings.Replace(createSQL(`"idem_keys"`, `"idem_keys_expiry"`), ",\n    steps       BLOB", "", 1)
	require.NotEqual(t, createSQL(`"idem_keys"`, `"idem_keys_expiry"`), old)
	_, err := db.Exec(old)
	require.NoError(t, err)
	b, err := New(context.Background(), db, Options{})
	require.NoError(t, err)
	ctx := context.Background()
	claim, won, err := b.Claim(ctx, backend.Record{Key: "k", Token: "t"}, time.Now(), time.Hour)
	require.NoError(t, err)
	require.True(t, won)
	require.NoError(t, b.RecordStep(ctx, "k", claim.Token, backend.Step{Name: "s", Value: []byte("v")}, time.Now()))
	rec, _, err := b.Get(ctx, "k", time.Now())
	require.NoError(t, err)
	require.Len(t, rec.Steps, 1)
	assert.Equal(t, "v", string(rec.Steps[0].Value))
}
