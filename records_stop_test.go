package idem_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemtest"
)

// sloppyLister is a MemoryBackend whose Each does not hand fn's error
// back as it is: it goes on past it (and reports it at the end), or
// wraps it so that errors.Is no longer finds it.
type sloppyLister struct {
	*idemtest.MemoryBackend
	goOn bool // keep calling fn after it failed
}

func (l sloppyLister) Each(ctx context.Context, fn func(backend.Record) error) error {
	var first error
	err := l.MemoryBackend.Each(ctx, func(rec backend.Record) error {
		if err := fn(rec); err != nil && first == nil {
			first = err
			if !l.goOn {
				return err
			}
		}
		return nil
	})
	if err == nil {
		err = first
	}
	if err != nil {
		return fmt.Errorf("listing: %v", err) // the error's identity is lost
	}
	return nil
}

// A loop over Store.Records that stops (break) ends there, whatever the
// Backend's Each does with the error that stopped it: no record and no
// error comes after, and no runtime panic ("range function continued
// iteration") reaches the caller.
func TestRecordsLoopThatStopsStaysStopped(t *testing.T) {
	for _, goOn := range []bool{false, true} {
		t.Run(fmt.Sprintf("goOn=%v", goOn), func(t *testing.T) {
			mem := idemtest.NewMemoryBackend()
			s := idem.New[string](idem.Options{Backend: sloppyLister{mem, goOn}, Logger: slog.New(slog.DiscardHandler)})
			defer closeWithin(t, s, 5*time.Second)
			for _, k := range []string{"a", "b", "c"} {
				if _, err := s.RunOnce(context.Background(), k, "p", func(context.Context) (string, error) { return "v", nil }); err != nil {
					t.Fatal(err)
				}
			}
			n := 0
			escaped, exited := isolated(func() {
				for _, err := range s.Records(context.Background()) {
					if err != nil {
						t.Errorf("an error after the first record: %v", err)
					}
					n++
					break
				}
			})
			if escaped != nil || exited {
				t.Fatalf("a loop that stopped: panic %v escaped (exited %v)", escaped, exited)
			}
			if n != 1 {
				t.Fatalf("the loop body ran %d times, want 1", n)
			}
		})
	}
}

// recoveringLister is a MemoryBackend whose Each recovers a panic in fn
// and returns it as an error.
type recoveringLister struct{ *idemtest.MemoryBackend }

func (l recoveringLister) Each(ctx context.Context, fn func(backend.Record) error) error {
	return l.MemoryBackend.Each(ctx, func(rec backend.Record) (err error) {
		defer func() {
			if v := recover(); v != nil {
				err = fmt.Errorf("fn panicked: %v", v)
			}
		}()
		return fn(rec)
	})
}

// A panic in the loop body over Store.Records reaches the caller as it
// was, even through a Backend whose Each recovers it.
func TestRecordsLoopBodyPanicOutlivesABackendThatRecoversIt(t *testing.T) {
	mem := idemtest.NewMemoryBackend()
	s := idem.New[string](idem.Options{Backend: recoveringLister{mem}, Logger: slog.New(slog.DiscardHandler)})
	defer closeWithin(t, s, 5*time.Second)
	for _, k := range []string{"a", "b"} {
		if _, err := s.RunOnce(context.Background(), k, "p", func(context.Context) (string, error) { return "v", nil }); err != nil {
			t.Fatal(err)
		}
	}
	type mine struct{ s string }
	escaped, _ := isolated(func() {
		for range s.Records(context.Background()) {
			panic(mine{"the caller's"})
		}
	})
	if escaped != (mine{"the caller's"}) {
		t.Fatalf("the loop body's panic came up as %v", escaped)
	}
}
