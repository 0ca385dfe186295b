package mysql

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The backend's reads of one key find its record whatever the session's
// sql_select_limit, which any code sharing the *sql.DB (a RunOnceTx's fn
// among them) may SET on a pooled connection: at 0 every SELECT without
// a LIMIT of its own returns no row. A completed key was then read as
// absent, and a claim of it on MySQL 8 (insert, then read) looped for
// as long as its ctx lasted.
func TestReadsOfAKeyIgnoreTheSessionsSelectLimit(t *testing.T) {
	for _, shape := range shapes {
		t.Run(shape.name, func(t *testing.T) {
			db := testDB(t)
			db.SetMaxOpenConns(1) // every statement on the connection SET below
			b, _ := testBackend(t, db)
			shape.apply(b)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			rec := backend.Record{Key: "done", Token: "t"}
			_, won, err := b.Claim(ctx, rec, time.Time{}, time.Minute)
			require.NoError(t, err)
			require.True(t, won)
			rec.Value = []byte("v")
			require.NoError(t, b.Complete(ctx, rec, time.Time{}, time.Minute))

			_, err = db.ExecContext(ctx, "SET SESSION sql_select_limit = 0")
			require.NoError(t, err)

			got, ok, err := b.Get(ctx, "done", time.Time{})
			require.NoError(t, err)
			require.True(t, ok, "Get found no record")
			assert.Equal(t, backend.StateCompleted, got.State)
			got, won, err = b.Claim(ctx, backend.Record{Key: "done", Token: "t2"}, time.Time{}, time.Minute)
			require.NoError(t, err, "a claim of a completed key")
			assert.False(t, won)
			assert.Equal(t, "v", string(got.Value), "the claim meets the outcome")

			s := idem.New[int](idem.Options{Backend: b})
			defer s.Close()
			runs := 0
			fn := func(ctx context.Context, tx *sql.Tx) (int, error) { runs++; return 7, nil }
			v, err := RunOnceTx(ctx, s, "tx", "p", fn)
			require.NoError(t, err)
			require.Equal(t, 7, v)
			s2 := idem.New[int](idem.Options{Backend: b}) // no memory of the first run
			defer s2.Close()
			v, err = RunOnceTx(ctx, s2, "tx", "p", fn)
			require.NoError(t, err, "RunOnceTx's replay")
			assert.Equal(t, 7, v)
			assert.Equal(t, 1, runs)
		})
	}
}
