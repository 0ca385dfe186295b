package postgres

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/seed094d4201/idem/backend"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A new key's claim and completion allocate one argument block each (the
// claim's holds the row it reads back); pgx makes the rest (its result
// reader, rows and command tag), and the watch of a ctx that can end takes
// three a statement (onConn's watch, context.AfterFunc's two, where pgx's
// own watching took one and a goroutine): 14 in all on a pool that is
// warm. The columns a claim returns have names of one letter, which
// pgx copies without allocating.
func TestNewKeyClaimAndCompleteAllocations(t *testing.T) {
	b, _ := testBackend(t, testPool(t))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const runs = 50
	keys := make([]string, runs+2)
	for i := range keys {
		keys[i] = fmt.Sprintf("k-%04d", i)
	}
	value := []byte(`{"Charge":1,"Amount":450}`)
	next := 0
	newKey := func() {
		rec := backend.Record{Key: keys[next], Token: "0123456789abcdef0123456789abcdef", Value: value}
		next++
		_, won, err := b.Claim(ctx, rec, time.Time{}, 30*time.Second)
		require.NoError(t, err)
		require.True(t, won)
		require.NoError(t, b.Complete(ctx, rec, time.Time{}, time.Minute))
	}
	newKey() // the statements prepared and cached
	assert.LessOrEqual(t, testing.AllocsPerRun(runs, newKey), 14.0)
}
