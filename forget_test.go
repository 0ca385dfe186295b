package idem_test

import (
	"context"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemtest"
)

type closingOnForget struct {
	*idemtest.MemoryBackend
	close func()
}

func (c closingOnForget) Forget(ctx context.Context, key string, now time.Time) error {
	err := c.MemoryBackend.Forget(ctx, key, now)
	c.close()
	return err
}

// A Close between the backend's delete and memory's: Forget said
// ErrClosed, yet the record was gone.
func TestForgetThatLandedIsNotReportedClosed(t *testing.T) {
	mem := idemtest.NewMemoryBackend()
	var s *idem.Store[int]
	s = idem.New[int](idem.Options{SweepInterval: -1, Backend: closingOnForget{mem, func() { go s.Close() }}})
	if _, err := s.RunOnce(context.Background(), "k", "p", func(context.Context) (int, error) { return 1, nil }); err != nil {
		t.Fatal(err)
	}
	err := s.Forget(context.Background(), "k")
	if _, ok, _ := mem.Get(context.Background(), "k", time.Now()); err != nil && !ok {
		t.Errorf("Forget returned %v, yet the record is gone", err)
	}
}
