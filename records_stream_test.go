package idem_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemtest"
)

// countingLister counts the records its Each hands on.
type countingLister struct {
	*idemtest.MemoryBackend
	handed int
}

func (c *countingLister) Each(ctx context.Context, fn func(backend.Record) error) error {
	return c.MemoryBackend.Each(ctx, func(rec backend.Record) error {
		c.handed++
		return fn(rec)
	})
}

// Records streams: a loop that stops at the first record has not made the
// backend read the rest, and a loop body may Forget the record it holds.
func TestRecordsStreamsAndTheLoopMayCallTheStore(t *testing.T) {
	const n = 1000
	cl := &countingLister{MemoryBackend: idemtest.NewMemoryBackend()}
	s := idem.New[int](idem.Options{Backend: cl})
	defer s.Close()
	ctx := context.Background()
	for i := range n {
		if _, err := s.RunOnce(ctx, fmt.Sprintf("k%04d", i), "p", func(context.Context) (int, error) { return i, nil }); err != nil {
			t.Fatal(err)
		}
	}
	for _, err := range s.Records(ctx, backend.StateCompleted) {
		if err != nil {
			t.Fatal(err)
		}
		break
	}
	if cl.handed >= n {
		t.Fatalf("a loop that stopped at its first record made Each read %d of %d records", cl.handed, n)
	}
	// Every state: the pass over interrupted records reads them all, the
	// second stops at its first.
	cl.handed = 0
	for _, err := range s.Records(ctx) {
		if err != nil {
			t.Fatal(err)
		}
		break
	}
	if cl.handed >= 2*n {
		t.Fatalf("a loop over every state that stopped at its first record made Each read %d records", cl.handed)
	}
	forgot := 0
	for rec, err := range s.Records(ctx, backend.StateCompleted) {
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Forget(ctx, rec.Key); err != nil {
			t.Fatalf("Forget(%q) inside the loop: %v", rec.Key, err)
		}
		forgot++
	}
	if forgot != n {
		t.Fatalf("forgot %d records inside the loop, want %d", forgot, n)
	}
	for _, err := range s.Records(ctx) {
		t.Fatalf("a record is left after forgetting every one (err %v)", err)
	}
}
