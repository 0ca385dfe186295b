package idemotel_test

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemotel"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// parked waits until a goroutine is blocked waiting for an execution in
// flight in the store (in idem's wait).
func parked(t *testing.T) {
	t.Helper()
	buf := make([]byte, 1<<20)
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); runtime.Gosched() {
		if strings.Contains(string(buf[:runtime.Stack(buf, true)]), "github.com/seed094d4201/idem.wait[") {
			return
		}
	}
	t.Fatal("the duplicate never waited")
}

// A scripted sequence: 1 executed, 2 replayed, 1 coalesced, 1 mismatch,
// 1 outcome unknown, seen by an OpenTelemetry reader and span recorder.
func TestCountsAndSpans(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	spans := tracetest.NewSpanRecorder()
	obs, err := idemotel.NewObserver(idemotel.Options{
		Store:          "payments",
		MeterProvider:  sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)),
		TracerProvider: sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans)),
	})
	require.NoError(t, err)
	mem := idemtest.NewMemoryBackend()
	fp, _ := idem.DefaultFingerprint("p")
	_, _, err = mem.Claim(context.Background(), backend.Record{Key: "dead", Fingerprint: fp, Token: "killed", State: backend.StatePending}, time.Now(), time.Minute)
	require.NoError(t, err)
	mem.Crash()
	s := idem.New[int](idem.Options{Backend: mem, Observer: obs})
	defer s.Close()
	ctx := context.Background()
	fn := func(context.Context) (int, error) { return 7, nil }

	tk, err := s.Begin(ctx, "order-101", "p") // executed
	require.NoError(t, err)
	waiter := make(chan error, 1)
	go func() { _, err := s.RunOnce(ctx, "order-101", "p", fn); waiter <- err }() // coalesced
	parked(t)
	_, err = tk.Finish(7, nil)
	require.NoError(t, err)
	require.NoError(t, <-waiter)
	for range 2 { // replayed
		_, err = s.RunOnce(ctx, "order-101", "p", fn)
		require.NoError(t, err)
	}
	_, err = s.RunOnce(ctx, "order-101", "another payload", fn) // mismatch
	require.ErrorIs(t, err, idem.ErrPayloadMismatch)
	_, err = s.RunOnce(ctx, "dead", "p", fn) // unknown
	require.ErrorIs(t, err, idem.ErrOutcomeUnknown)

	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(ctx, &rm))
	counts := map[string]int64{}
	durations := map[string]uint64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch data := m.Data.(type) {
			case metricdata.Sum[int64]:
				if m.Name != "idem.calls" {
					continue
				}
				for _, dp := range data.DataPoints {
					out, _ := dp.Attributes.Value("idem.outcome")
					store, _ := dp.Attributes.Value("idem.store")
					assert.Equal(t, "payments", store.AsString())
					if dp.Value != 0 {
						counts[out.AsString()] += dp.Value
					}
				}
			case metricdata.Histogram[float64]:
				for _, dp := range data.DataPoints {
					out, _ := dp.Attributes.Value("idem.outcome")
					durations[out.AsString()] += dp.Count
				}
			}
		}
	}
	assert.Equal(t, map[string]int64{"executed": 1, "replayed": 2, "coalesced": 1, "mismatch": 1, "outcome_unknown": 1}, counts)
	assert.Equal(t, uint64(1), durations["coalesced"], "the wait is timed")
	assert.Equal(t, uint64(1), durations["executed"])

	names := map[string]int{}
	for _, sp := range spans.Ended() {
		names[sp.Name()]++
		for _, kv := range sp.Attributes() {
			assert.NotEqual(t, "order-101", kv.Value.AsString(), "a raw key on a span")
		}
	}
	assert.Equal(t, 1, names["idem.execute"], "one execution: %v", names)
	assert.Equal(t, 1, names["idem.record"], "one outcome recorded: %v", names)
	assert.GreaterOrEqual(t, names["idem.claim"], 1, "%v", names)
}
