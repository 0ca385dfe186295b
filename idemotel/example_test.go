package idemotel_test

import (
	"context"
	"fmt"
	"sort"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemotel"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// A store reporting to OpenTelemetry. In a service the MeterProvider has a
// Prometheus or OTLP exporter; here a manual reader collects the metrics
// and prints the calls by outcome.
func ExampleNewObserver() {
	reader := sdkmetric.NewManualReader()
	obs, err := idemotel.NewObserver(idemotel.Options{
		Store:         "payments",
		MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)),
	})
	if err != nil {
		panic(err)
	}
	store := idem.New[int](idem.Options{Observer: obs})
	defer store.Close()

	ctx := context.Background()
	charge := func(context.Context) (int, error) { return 450, nil }
	store.RunOnce(ctx, "order-101", "450", charge) // runs
	store.RunOnce(ctx, "order-101", "450", charge) // a retry: replayed
	store.RunOnce(ctx, "order-101", "990", charge) // another request: mismatch

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		panic(err)
	}
	var lines []string
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if sum, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == "idem.calls" {
				for _, dp := range sum.DataPoints {
					if out, _ := dp.Attributes.Value("idem.outcome"); dp.Value > 0 {
						lines = append(lines, fmt.Sprintf("idem.calls{outcome=%s} %d", out.AsString(), dp.Value))
					}
				}
			}
		}
	}
	sort.Strings(lines)
	for _, l := range lines {
		fmt.Println(l)
	}
	// Output:
	// idem.calls{outcome=executed} 1
	// idem.calls{outcome=mismatch} 1
	// idem.calls{outcome=replayed} 1
}
