package bench

import (
	"context"
	"testing"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemotel"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// BenchmarkObserver replays a remembered key through RunOnce with no
// Observer, and with idemotel's reporting to the OpenTelemetry SDK (a
// meter with a reader, a tracer that samples everything): what
// observability adds to the most common call.
func BenchmarkObserver(b *testing.B) {
	fn := func(context.Context) (receipt, error) { return fnReceipt, nil }
	for _, tc := range []struct {
		name string
		obs  func(b *testing.B) *idem.Observer
	}{
		{"none", func(*testing.B) *idem.Observer { return nil }},
		{"idemotel", func(b *testing.B) *idem.Observer {
			o, err := idemotel.NewObserver(idemotel.Options{
				Store:          "bench",
				MeterProvider:  sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader())),
				TracerProvider: sdktrace.NewTracerProvider(),
			})
			if err != nil {
				b.Fatal(err)
			}
			return o
		}},
	} {
		b.Run("observer="+tc.name, func(b *testing.B) {
			s := idem.New[receipt](idem.Options{Observer: tc.obs(b)})
			defer s.Close()
			ctx := context.Background()
			if _, err := s.RunOnce(ctx, "k", boxed, fn); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if _, err := s.RunOnce(ctx, "k", boxed, fn); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
