package postgres

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/seed094d4201/idem"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Two Stores of different TTLs on one Backend, and more records of the
// longer TTL turning early than one re-aim moves: one sweep cycle moves
// them all along, rather than leave them piled up at the front of the
// sweep's index, read by every sweep.
func TestReaimKeepsUpWithEarlyRows(t *testing.T) {
	pool := testPool(t)
	ctx := context.Background()
	b, table := testBackend(t, pool)
	short := idem.New[int](idem.Options{Backend: b, TTL: 50 * time.Millisecond, SweepInterval: -1})
	defer short.Close()
	long := idem.New[int](idem.Options{Backend: b, TTL: time.Hour, SweepInterval: -1})
	defer long.Close()
	_, err := short.RunOnce(ctx, "learn", nil, func(context.Context) (int, error) { return 1, nil })
	require.NoError(t, err) // the Backend learns 50 ms
	const n = 3000
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for i := range n {
			key, tok := fmt.Sprint("long-", i), fmt.Sprint("t-", i)
			if _, err := tx.Exec(ctx, b.q.claim, key, make([]byte, 32), tok, micros(time.Minute), b.ttl.Load()); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, b.q.complete, key, tok, micros(time.Hour), []byte("1"), false, ""); err != nil {
				return err
			}
		}
		return nil
	}))
	untilServerPassed(t, b, table, "sweep_at", "long-2999")
	_, err = long.Sweep(ctx) // one sweep cycle, as the sweeper runs it
	require.NoError(t, err)
	var early int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+table+` WHERE sweep_at <= now() AND NOT (state = 2 AND expires_at <= now())`).Scan(&early))
	assert.Zero(t, early, "rows found early, left at the front of the index after a sweep cycle")
}
