package redis

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/seed094d4201/idem/backend"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A new key's claim and completion under a ctx that can end, each waited
// on from a goroutine of its own, allocate for each call the command (its
// arguments, the sender's answer and the ctx inside), its done channel and
// the record's encoding: 6 in all, the sender being one that waits for
// commands already (senders). go-redis makes the rest (its pool's health
// check of the connection, the reply): 7.
func TestNewKeyClaimAndCompleteAllocations(t *testing.T) {
	rdb := testClient(t)
	b := testBackend(t, rdb)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const runs = 200
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
	newKey() // the eviction policy's first read, the scripts loaded
	assert.LessOrEqual(t, testing.AllocsPerRun(runs, newKey), 13.0)
}
