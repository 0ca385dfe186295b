package idem_test

import (
	"context"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemtest"
)

// forgetThen is a Backend whose Forget runs after once the record is
// deleted, before the reply reaches the store.
type forgetThen struct {
	backend.Backend
	after func()
}

func (f forgetThen) Forget(ctx context.Context, key string, now time.Time) error {
	err := f.Backend.Forget(ctx, key, now)
	if err == nil && f.after != nil {
		f.after()
	}
	return err
}

// A call that claims the key in this store while the Backend deletes its
// old record does not make Forget report ErrKeyHeld: the record is gone,
// and the new call's run is one the forget licensed (the model suite's
// Redis run, seed 4192397370944503801, once saw ErrKeyHeld here).
func TestForgetRacingANewClaimIsNotKeyHeld(t *testing.T) {
	mem := idemtest.NewMemoryBackend()
	fb := &forgetThen{Backend: mem}
	s := idem.New[int](idem.Options{Backend: fb})
	defer closeWithin(t, s, 5*time.Second)
	ctx := context.Background()
	if _, err := s.RunOnce(ctx, "k", "p", func(context.Context) (int, error) { return 1, nil }); err != nil {
		t.Fatal(err)
	}
	entered, release, done := make(chan struct{}), make(chan struct{}), make(chan int, 1)
	fb.after = func() {
		go func() {
			v, _ := s.RunOnce(ctx, "k", "p", func(context.Context) (int, error) {
				close(entered)
				<-release
				return 2, nil
			})
			done <- v
		}()
		<-entered // the new call holds the key here before Forget looks
	}
	err := s.Forget(ctx, "k")
	close(release)
	if err != nil {
		t.Fatalf("Forget after the record was deleted = %v, want nil", err)
	}
	if v := <-done; v != 2 {
		t.Fatalf("the call after the forget = %d, want its own run's 2", v)
	}
	v, err := s.RunOnce(ctx, "k", "p", func(context.Context) (int, error) { return 3, nil })
	if v != 2 || err != nil {
		t.Fatalf("a replay after both = %d, %v; want 2, nil", v, err)
	}
}

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
