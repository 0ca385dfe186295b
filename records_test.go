package idem_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemtest"
)

// Records lists no expired record, ends under a cancelled ctx, and says
// ErrNotListable for a store without a Lister.
func TestRecordsSkipsExpiredHonoursCtxAndNeedsALister(t *testing.T) {
	clock := newFakeClock()
	mem := idemtest.NewMemoryBackend()
	s := newStore[int](t, idem.Options{Backend: mem, Now: clock.Now, TTL: time.Minute, SweepInterval: -1})
	for _, k := range []string{"a", "b", "c"} {
		s.RunOnce(context.Background(), k, nil, func(context.Context) (int, error) { return 1, nil })
	}
	clock.Advance(2 * time.Minute)
	n := 0
	for _, err := range s.Records(context.Background()) {
		if err != nil {
			t.Fatal(err)
		}
		n++
	}
	if n != 0 {
		t.Errorf("expired records listed: %d", n)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, err := range s.Records(ctx) {
		t.Logf("cancelled ctx: %v", err)
	}
	plain := newStore[int](t, idem.Options{SweepInterval: -1})
	for _, err := range plain.Records(context.Background()) {
		if !errors.Is(err, idem.ErrNotListable) {
			t.Errorf("no backend: %v", err)
		}
	}
	if err := plain.Resolve(context.Background(), "a", 1, nil); !errors.Is(err, idem.ErrNotInterrupted) {
		t.Errorf("memory-only Resolve: %v", err)
	}
}
