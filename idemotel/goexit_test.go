package idemotel_test

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemotel"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/stretchr/testify/assert"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// The Codec ends the goroutine (t.FailNow in a test Codec) while the
// outcome is being recorded: every span started is ended, and idem.outcome
// is set on the execute span.
type goexitCodec struct{ idem.JSONCodec }

func (goexitCodec) Marshal(v any) ([]byte, error) { runtime.Goexit(); return nil, nil }

func TestCodecGoexitEndsEverySpan(t *testing.T) {
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	obs, err := idemotel.NewObserver(idemotel.Options{TracerProvider: tp, MeterProvider: sdkmetric.NewMeterProvider()})
	assert.NoError(t, err)
	s := idem.New[int](idem.Options{Observer: obs, Backend: idemtest.NewMemoryBackend(), Codec: goexitCodec{}})
	defer s.Close()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, _ = s.RunOnce(context.Background(), "k", "p", func(context.Context) (int, error) { return 1, nil })
	}()
	wg.Wait()
	var started, ended []string
	for _, sp := range spans.Started() {
		started = append(started, sp.Name())
	}
	outcomeOn := ""
	for _, sp := range spans.Ended() {
		ended = append(ended, sp.Name())
		for _, kv := range sp.Attributes() {
			if kv.Key == attribute.Key("idem.outcome") {
				outcomeOn += sp.Name() + "=" + kv.Value.AsString() + " "
			}
		}
	}
	t.Logf("started %v ended %v outcome on %q", started, ended, outcomeOn)
	assert.ElementsMatch(t, started, ended, "every span started is ended")
	assert.Contains(t, outcomeOn, "idem.execute=")
}

// Observer.Call Goexits: execute span and executing gauge must still end.
func TestCallGoexitEndsSpansAndExecuting(t *testing.T) {
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	obs, _ := idemotel.NewObserver(idemotel.Options{TracerProvider: tp, MeterProvider: sdkmetric.NewMeterProvider()})
	var exec int
	var once atomic.Bool
	var mu sync.Mutex
	o := *obs
	_ = o.Call
	_ = o
	obs2 := &idem.Observer{Span: obs.Span, Executing: func(ctx context.Context, d int) { mu.Lock(); exec += d; mu.Unlock() }}
	obs2.Call = func(ctx context.Context, k string, out idem.Outcome, d time.Duration) {
		obs.Call(ctx, k, out, d)
		if once.CompareAndSwap(false, true) {
			runtime.Goexit()
		}
	}
	s := idem.New[int](idem.Options{Observer: obs2, Backend: idemtest.NewMemoryBackend()})
	defer s.Close()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, _ = s.RunOnce(context.Background(), "k", "p", func(context.Context) (int, error) { return 1, nil })
	}()
	wg.Wait()
	assert.Len(t, spans.Ended(), len(spans.Started()))
	assert.Equal(t, 0, exec)
	v, err := s.RunOnce(context.Background(), "k", "p", func(context.Context) (int, error) { return 2, nil })
	assert.NoError(t, err)
	assert.Equal(t, 1, v)
}
