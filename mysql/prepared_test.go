package mysql

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/seed094d4201/idem/backend"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// sessionCount reads one of the session's status counters, on a pool of
// one: the connection the backend's statements ran on.
func sessionCount(t *testing.T, db *sql.DB, name string) int64 {
	t.Helper()
	var n int64
	var got string
	require.NoError(t, db.QueryRow(`SHOW SESSION STATUS LIKE '`+name+`'`).Scan(&got, &n))
	return n
}

// A new key's statements (the claim's insert and Complete) are prepared
// once per connection and then executed by their handle, with or without
// interpolateParams: the server parses them once, not at every call.
func TestNewKeyStatementsArePreparedOncePerConnection(t *testing.T) {
	for _, interpolate := range []string{"interpolateParams=false", "interpolateParams=true"} {
		db := testDB(t, interpolate)
		db.SetMaxOpenConns(1)
		for _, shape := range shapes {
			t.Run(interpolate+"/"+shape.name, func(t *testing.T) {
				b, _ := testBackend(t, db)
				shape.apply(b)
				ctx := context.Background()
				prepares, executes := sessionCount(t, db, "Com_stmt_prepare"), sessionCount(t, db, "Com_stmt_execute")
				const keys = 5
				for i := range keys {
					rec := backend.Record{Key: "k" + string(rune('a'+i)), Token: "t"}
					_, won, err := b.Claim(ctx, rec, time.Time{}, time.Minute)
					require.NoError(t, err)
					require.True(t, won)
					rec.Value = []byte("v")
					require.NoError(t, b.Complete(ctx, rec, time.Time{}, time.Minute))
				}
				// A new key is two statements on both shapes: the claim
				// (RETURNING, or the insert, which reports the claim it
				// made) and Complete.
				const statements = int64(2)
				assert.Equal(t, statements, sessionCount(t, db, "Com_stmt_prepare")-prepares, "each prepared once")
				assert.Equal(t, statements*keys, sessionCount(t, db, "Com_stmt_execute")-executes, "and executed by its handle")
				got, ok, err := b.Get(ctx, "ka", time.Time{})
				require.NoError(t, err)
				require.True(t, ok)
				assert.Equal(t, backend.StateCompleted, got.State)
				assert.Equal(t, "v", string(got.Value))
			})
		}
	}
}

// A statement the server cannot prepare yet (NoMigrate, before the table
// exists) fails as the plain query would, and once the table is there the
// backend works, sending it as a plain query until it prepares it.
func TestClaimWorksOnceATableMissingAtFirstCallExists(t *testing.T) {
	db := testDB(t)
	table := tableName(t, db)
	b, err := New(context.Background(), db, Options{Table: table, NoMigrate: true})
	require.NoError(t, err)
	ctx := context.Background()
	rec := backend.Record{Key: "k", Token: "t"}
	_, _, err = b.Claim(ctx, rec, time.Time{}, time.Minute)
	require.ErrorIs(t, err, backend.ErrRefused, "no table: refused, nothing written")
	_, err = db.Exec(createTableSQL("`" + table + "`"))
	require.NoError(t, err)
	_, won, err := b.Claim(ctx, rec, time.Time{}, time.Minute)
	require.NoError(t, err)
	require.True(t, won)
	rec.Value = []byte("v")
	require.NoError(t, b.Complete(ctx, rec, time.Time{}, time.Minute))
	got, ok, err := b.Get(ctx, "k", time.Time{})
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, backend.StateCompleted, got.State)
}
