package idemotel_test

import (
	"context"
	"errors"
	"testing"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemotel"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// collect returns the metrics by name, and the scope's version.
func collect(t *testing.T, reader *sdkmetric.ManualReader) (map[string]metricdata.Metrics, string) {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	byName := map[string]metricdata.Metrics{}
	version := ""
	for _, sm := range rm.ScopeMetrics {
		version = sm.Scope.Version
		for _, m := range sm.Metrics {
			byName[m.Name] = m
		}
	}
	return byName, version
}

func executed(m metricdata.Metrics) int64 {
	var n int64
	for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
		if out, _ := dp.Attributes.Value("idem.outcome"); out.AsString() == "executed" {
			n += dp.Value
		}
	}
	return n
}

// Durations resolve microseconds to seconds; every counter has a unit; the
// meter carries a version.
func TestMetricsFollowTheConventions(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	obs, err := idemotel.NewObserver(idemotel.Options{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))})
	require.NoError(t, err)
	s := idem.New[int](idem.Options{Observer: obs})
	defer s.Close()
	_, err = s.RunOnce(context.Background(), "k", "p", func(context.Context) (int, error) { return 1, nil })
	require.NoError(t, err)
	s.Sweep(context.Background())

	metrics, version := collect(t, reader)
	assert.NotEmpty(t, version, "the instrumentation scope's version")
	h := metrics["idem.call.duration"].Data.(metricdata.Histogram[float64])
	require.Len(t, h.DataPoints, 1)
	dp := h.DataPoints[0]
	assert.Equal(t, "s", metrics["idem.call.duration"].Unit)
	assert.Less(t, dp.Bounds[0], 0.00001, "the first bucket holds a call of microseconds")
	assert.Equal(t, 10.0, dp.Bounds[len(dp.Bounds)-1])
	// The call took microseconds: it is counted in a bucket below 1 ms,
	// not in the SDK default's first (0, 5].
	var below uint64
	for i, b := range dp.Bounds {
		if b <= 0.001 {
			below += dp.BucketCounts[i]
		}
	}
	assert.Equal(t, uint64(1), below, "bounds %v counts %v", dp.Bounds, dp.BucketCounts)
	for name, unit := range map[string]string{"idem.calls": "{call}", "idem.executions": "{execution}", "idem.sweep.removed": "{key}", "idem.sweep.errors": "{sweep}"} {
		if m, ok := metrics[name]; ok {
			assert.Equal(t, unit, m.Unit, name)
		} else if name != "idem.sweep.errors" { // reported only once a sweep fails
			t.Errorf("no metric %s", name)
		}
	}
}

// Two stores with one name on one MeterProvider add up; they are not one
// store's count winning over the other's.
func TestStoresSharingANameAddUp(t *testing.T) {
	for _, name := range []string{"", "payments"} {
		reader := sdkmetric.NewManualReader()
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
		run := func(n int) {
			obs, err := idemotel.NewObserver(idemotel.Options{Store: name, MeterProvider: mp})
			require.NoError(t, err)
			s := idem.New[int](idem.Options{Observer: obs})
			defer s.Close()
			for i := range n {
				_, err := s.RunOnce(context.Background(), string(rune('a'+i)), "p", func(context.Context) (int, error) { return 1, nil })
				require.NoError(t, err)
			}
		}
		run(3)
		run(5)
		metrics, _ := collect(t, reader)
		assert.Equal(t, int64(8), executed(metrics["idem.calls"]), "store name %q", name)
	}
}

// A span's status is Error only for what failed; how the call ended is
// idem.outcome, on the execute span or on the caller's own.
func TestSpansSayHowACallEnded(t *testing.T) {
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	obs, err := idemotel.NewObserver(idemotel.Options{TracerProvider: tp, MeterProvider: sdkmetric.NewMeterProvider()})
	require.NoError(t, err)
	s := idem.New[int](idem.Options{Observer: obs, Backend: idemtest.NewMemoryBackend()})
	defer s.Close()
	declined := idem.Final(errors.New("card declined"))
	call := func(name, payload string, fn func(context.Context) (int, error)) {
		ctx, caller := tp.Tracer("test").Start(context.Background(), name)
		_, _ = s.RunOnce(ctx, "k", payload, fn)
		caller.End()
	}
	call("first", "p", func(context.Context) (int, error) { return 0, declined })
	call("retry", "p", func(context.Context) (int, error) { return 1, nil })
	call("other", "q", func(context.Context) (int, error) { return 1, nil })

	outcome := func(sp sdktrace.ReadOnlySpan) string {
		for _, kv := range sp.Attributes() {
			if kv.Key == attribute.Key("idem.outcome") {
				return kv.Value.AsString()
			}
		}
		return ""
	}
	byName := map[string]sdktrace.ReadOnlySpan{}
	for _, sp := range spans.Ended() {
		byName[sp.Name()] = sp
		switch sp.Name() {
		case "idem.record":
			assert.NotEqual(t, codes.Error, sp.Status().Code, "the record of a final error landed: nothing failed")
		case "idem.claim":
			assert.NotEqual(t, codes.Error, sp.Status().Code, "a claim that found a replay or a mismatch did its part")
		}
	}
	assert.Equal(t, "executed", outcome(byName["idem.execute"]))
	assert.Equal(t, codes.Error, byName["idem.execute"].Status().Code, "the work failed")
	assert.Equal(t, "replayed", outcome(byName["retry"]))
	assert.Equal(t, "mismatch", outcome(byName["other"]))
}
