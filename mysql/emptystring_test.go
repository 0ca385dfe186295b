package mysql

import (
	"context"
	"database/sql"
	"strings"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// On a server whose sql_mode adds EMPTY_STRING_IS_NULL to the strict
// default, where an empty string, a parameter too, is NULL: every success
// (whose error message is empty) is recorded and replayed, by RunOnce and
// RunOnceTx, and the records list from the first key (after "").
func TestEmptyStringIsNullRecordsOutcomes(t *testing.T) {
	for _, params := range [][]string{
		{"sql_mode=%27STRICT_TRANS_TABLES,EMPTY_STRING_IS_NULL%27"},
		{"sql_mode=%27STRICT_TRANS_TABLES,EMPTY_STRING_IS_NULL%27", "interpolateParams=true"},
	} {
		t.Run(strings.Join(params, "&"), func(t *testing.T) {
			db := testDB(t, params...)
			s, b, name := txFixture(t, db)
			// Bounded: a key left pending would hold a retry up for ever.
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			calls := 0
			plain := func(context.Context) (int, error) { calls++; return 3, nil }
			v, err := s.RunOnce(ctx, "k", "p", plain)
			require.NoError(t, err)
			assert.Equal(t, 3, v)
			rec, found, err := b.Get(ctx, "k", time.Time{})
			require.NoError(t, err)
			require.True(t, found)
			assert.Equal(t, backend.StateCompleted, rec.State, "RunOnce's outcome is recorded")

			other := idem.New[int](idem.Options{Backend: b})
			defer other.Close()
			v, err = other.RunOnce(ctx, "k", "p", plain)
			require.NoError(t, err)
			assert.Equal(t, 3, v)
			assert.Equal(t, 1, calls, "another store replays it")

			charge := func(ctx context.Context, tx *sql.Tx) (int, error) {
				calls++
				_, err := tx.ExecContext(ctx, "INSERT INTO "+name+" (note) VALUES ('t')")
				return 4, err
			}
			v, err = RunOnceTx(ctx, s, "t", "p", charge)
			require.NoError(t, err, "RunOnceTx records its outcome")
			assert.Equal(t, 4, v)
			v, err = RunOnceTx(ctx, other, "t", "p", charge)
			require.NoError(t, err)
			assert.Equal(t, 4, v)
			assert.Equal(t, 2, calls, "and another store replays it")
			assert.Equal(t, 1, count(t, db, "SELECT count(*) FROM "+name))

			var keys []string
			require.NoError(t, b.Each(ctx, func(r backend.Record) error { keys = append(keys, r.Key); return nil }))
			assert.Equal(t, []string{"k", "t"}, keys, "the records list from the first")
		})
	}
}

// The Backend's conformance suite, on such a server.
func TestConformanceEmptyStringIsNull(t *testing.T) {
	db := testDB(t, "sql_mode=%27STRICT_TRANS_TABLES,EMPTY_STRING_IS_NULL%27", "interpolateParams=true")
	idemtest.Run(t, func(t *testing.T) backend.Backend {
		b, _ := testBackend(t, db)
		return b
	})
	idemtest.RunSteps(t, func(t *testing.T) backend.Stepper {
		b, _ := testBackend(t, db)
		return b
	})
}
