package idem_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
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
