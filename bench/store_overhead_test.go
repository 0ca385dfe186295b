package bench

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemtest"
)

// BenchmarkStoreOverBackend isolates what the Store itself costs a new key
// on a shared backend: RunOnce over a Backend that answers at once
// (idemtest's MemoryBackend), against the same Backend's Claim and
// Complete called directly (impl=backend-alone). The difference is the
// Store's: its contexts, lease timer, token, codec and entry.
func BenchmarkStoreOverBackend(b *testing.B) {
	for _, g := range []int{1, 16} {
		b.Run(fmt.Sprintf("impl=idem/g=%d", g), func(b *testing.B) {
			do := idemShared(b, idemtest.NewMemoryBackend())
			keys := makeKeys(b.N)
			forEach(b, g, func(i int) { do(keys[i]) })
		})
		b.Run(fmt.Sprintf("impl=backend-alone/g=%d", g), func(b *testing.B) {
			be := idemtest.NewMemoryBackend()
			keys := makeKeys(b.N)
			ctx := context.Background()
			forEach(b, g, func(i int) {
				rec := backend.Record{Key: keys[i], Token: "0123456789abcdef0123456789abcdef", State: backend.StatePending}
				if _, ok, err := be.Claim(ctx, rec, time.Now(), 30*time.Second); err != nil || !ok {
					panic(fmt.Sprint("claim: ", ok, err))
				}
				rec.State, rec.Value = backend.StateCompleted, boltRecord
				if err := be.Complete(ctx, rec, time.Now(), time.Minute); err != nil {
					panic(err)
				}
			})
		})
	}
}
