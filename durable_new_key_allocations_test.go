package idem_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/stretchr/testify/assert"
)

// A new key over a Backend: the Store's claim and record contexts, its
// token, codec and entry, and the lease, which waits in the store's queue
// under one timer rather than make one of its own, since fn ends before
// its first renewal (the Backend, idemtest's MemoryBackend, allocates a
// few of its own too).
func TestDurableNewKeyAllocations(t *testing.T) {
	type receipt struct{ ID, Amount int64 }
	s := idem.New[receipt](idem.Options{Backend: idemtest.NewMemoryBackend()})
	t.Cleanup(func() { _ = s.Close() })
	var payload any = []byte("a payload of the usual kind") // boxed once: the loop measures the store
	fn := func(context.Context) (receipt, error) { return receipt{ID: 1, Amount: 450}, nil }
	const warm, runs = 1024, 200
	keys := make([]string, warm+runs+1)
	for i := range keys {
		keys[i] = fmt.Sprintf("key-%06d", i)
	}
	ctx := context.Background()
	for _, k := range keys[:warm] {
		if _, err := s.RunOnce(ctx, k, payload, fn); err != nil {
			t.Fatal(err)
		}
	}
	next := warm
	allocs := testing.AllocsPerRun(runs, func() {
		if _, err := s.RunOnce(ctx, keys[next], payload, fn); err != nil {
			t.Error(err)
		}
		next++
	})
	want := 18.0
	if raceEnabled {
		want++ // the detector's own, on this path
	}
	assert.LessOrEqual(t, allocs, want)
}
