package mysql

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/seed094d4201/idem/backend"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The backend's prepared statements outlive DDL on the keys' table made
// after they were prepared (a column added before the others, an index,
// the column dropped again, the table rebuilt): the server re-prepares
// them, and every claim, outcome and replay after each change reads and
// writes the record's own columns, as before it.
func TestPreparedStatementsOutliveAlterTable(t *testing.T) {
	for _, shape := range shapes {
		t.Run(shape.name, func(t *testing.T) {
			db := testDB(t)
			db.SetMaxOpenConns(2)
			b, table := testBackend(t, db)
			shape.apply(b)
			ctx := context.Background()
			round := func(key string) {
				t.Helper()
				rec := backend.Record{Key: key, Token: "t"}
				_, won, err := b.Claim(ctx, rec, time.Time{}, time.Minute)
				require.NoError(t, err)
				require.True(t, won, key)
				rec.Value = []byte("v-" + key)
				require.NoError(t, b.Complete(ctx, rec, time.Time{}, time.Minute))
				got, won, err := b.Claim(ctx, backend.Record{Key: key, Token: "t2"}, time.Time{}, time.Minute)
				require.NoError(t, err)
				assert.False(t, won, "%s: the outcome stands", key)
				assert.Equal(t, backend.StateCompleted, got.State, key)
				assert.Equal(t, "v-"+key, string(got.Value), key)
				assert.Equal(t, "t", got.Token, key)
			}
			round("before")
			for i, ddl := range []string{
				"ADD COLUMN extra INT NULL FIRST",
				"ADD INDEX ix_extra (extra)",
				"DROP COLUMN extra",
				"ENGINE=InnoDB",
			} {
				_, err := db.Exec("ALTER TABLE `" + table + "` " + ddl)
				require.NoError(t, err)
				round(fmt.Sprintf("after-%d", i))
			}
		})
	}
}
