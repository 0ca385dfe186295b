package idemtest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/seed094d4201/idem/backend"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// testSweepRacesTakeover: sweeps running while claims take expired records
// over, at once, never delete a claim that won: each key keeps exactly one
// winner, whose record stands after every sweep has ended.
func testSweepRacesTakeover(t *testing.T, b backend.Backend) {
	const keys, claimers, sweepers = 20, 4, 4
	ctx := context.Background()
	name := func(i int) string { return fmt.Sprintf("swept-%d", i) }
	for i := range keys {
		claimAndComplete(t, b, name(i), "old", shortTTL)
	}
	eventually(t, func() bool {
		for i := range keys {
			if _, ok := get(t, b, name(i)); ok {
				return false
			}
		}
		return true
	}, "the records expire")

	start := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	winners := map[string][]string{}
	for range sweepers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for range keys {
				_, err := b.Sweep(ctx, time.Now(), 2)
				assert.NoError(t, err)
			}
		}()
	}
	for i := range keys {
		for range claimers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				req := request(name(i))
				<-start
				_, won, err := b.Claim(ctx, req, time.Now(), lease)
				if assert.NoError(t, err) && won {
					mu.Lock()
					winners[req.Key] = append(winners[req.Key], req.Token)
					mu.Unlock()
				}
			}()
		}
	}
	close(start)
	wg.Wait()
	_, err := b.Sweep(ctx, time.Now(), 1000)
	require.NoError(t, err)
	for i := range keys {
		key := name(i)
		require.Len(t, winners[key], 1, "exactly one claim of %s wins", key)
		got, ok := get(t, b, key)
		require.True(t, ok, "the claim that won %s was swept away", key)
		assert.Equal(t, winners[key][0], got.Token, "%s holds another claim than the winner's", key)
		assert.Equal(t, backend.StatePending, got.State)
	}
}
