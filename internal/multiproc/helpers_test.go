package multiproc

import (
	"context"
	"database/sql"
	"os"
	"strconv"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/internal/svctest"
	"github.com/seed094d4201/idem/mysql"
	"github.com/stretchr/testify/require"
)

// testPool connects to the PostgreSQL svctest.Postgres finds, closed when the
// test ends, or skips the test: every test here counts side effects there.
func testPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	dsn := svctest.Postgres(t)
	pool, err := pgxpool.New(context.Background(), dsn)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// uniqueName is prefix and a suffix no other test run shares.
func uniqueName(prefix string) string {
	return prefix + strconv.FormatInt(time.Now().UnixNano(), 36)
}

// dropLater drops table when the test ends.
func dropLater(t *testing.T, pool *pgxpool.Pool, table string) {
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+table) })
}

// effectsTable creates a table with a row per side effect (the key, and the
// pid of the process that caused it), dropped when the test ends.
func effectsTable(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	table := uniqueName("idem_effects_")
	_, err := pool.Exec(context.Background(), "CREATE TABLE "+table+" (key text NOT NULL, pid int NOT NULL)")
	require.NoError(t, err)
	dropLater(t, pool, table)
	return table
}

// countRows runs a query that returns one number.
func countRows(t *testing.T, pool *pgxpool.Pool, query string) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), query).Scan(&n))
	return n
}

// openMySQL opens a mysql Backend over table name in the database
// IDEM_MYSQL_DSN names, and a func that closes its *sql.DB.
func openMySQL(ctx context.Context, name string) (backend.Backend, func(), error) {
	db, err := sql.Open("mysql", os.Getenv("IDEM_MYSQL_DSN"))
	if err != nil {
		return nil, nil, err
	}
	b, err := mysql.New(ctx, db, mysql.Options{Table: name})
	if err != nil {
		db.Close()
		return nil, nil, err
	}
	return b, func() { db.Close() }, nil
}

// dropMySQLLater drops MySQL table name when the test ends.
func dropMySQLLater(t *testing.T, table string) {
	t.Cleanup(func() {
		db, err := sql.Open("mysql", os.Getenv("IDEM_MYSQL_DSN"))
		if err == nil {
			_, _ = db.Exec("DROP TABLE IF EXISTS " + table)
			db.Close()
		}
	})
}
