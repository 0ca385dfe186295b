package idem_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemtest"
)

// Found by idemtest.RunModel: an Observer whose Span panics, once, at the
// start of a Begin. The store recovered the panic but went on with a nil
// context, so Begin panicked with a nil dereference that escaped the
// library and left the key in flight for good.
func TestModelFoundSpanPanicLeftNilContext(t *testing.T) {
	for _, tc := range []struct {
		name    string
		backend bool
	}{{"memory", false}, {"durable", true}} {
		t.Run(tc.name, func(t *testing.T) {
			panics := 1
			opts := idem.Options{
				Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
				Observer: &idem.Observer{Span: func(ctx context.Context, _, _ string) (context.Context, func(error)) {
					if panics > 0 {
						panics--
						panic("a broken tracer")
					}
					return ctx, func(error) {}
				}},
			}
			if tc.backend {
				opts.Backend = idemtest.NewMemoryBackend()
			}
			s := idem.New[int](opts)
			defer closeWithin(t, s, 5*time.Second)
			ctx := context.Background()
			var tk *idem.Ticket[int]
			var err error
			func() {
				defer func() {
					if v := recover(); v != nil {
						t.Fatalf("Begin panicked: %v", v)
					}
				}()
				tk, err = s.Begin(ctx, "order-1", "p")
			}()
			if err != nil {
				t.Fatalf("Begin: %v", err)
			}
			if tk.Context() == nil {
				t.Fatal("the ticket's context is nil")
			}
			if v, err := tk.Finish(7, nil); v != 7 || err != nil {
				t.Fatalf("Finish = %d, %v", v, err)
			}
			v, err := s.RunOnce(ctx, "order-1", "p", func(context.Context) (int, error) { return 8, nil })
			if v != 7 || err != nil {
				t.Fatalf("the replay = %d, %v, want 7, nil", v, err)
			}
		})
	}
}

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

// Found by idemtest.RunModel on Redis (seed 4192397370944503801): a call
// claimed the key in this store while the Backend was deleting its old
// record. Forget then reported ErrKeyHeld although the record was gone, so
// the new call's run looked to the operator like one no forget licensed.
func TestModelFoundForgetRacingANewClaim(t *testing.T) {
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
