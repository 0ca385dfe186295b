package idemotel_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemotel"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// keyNamingBackend fails claims and completions with errors that name the
// key, bare and quoted, as backends' errors do (bolt's "key %q is ...").
type keyNamingBackend struct {
	*idemtest.MemoryBackend
	failClaim bool
}

func (b *keyNamingBackend) Claim(ctx context.Context, rec backend.Record, now time.Time, lease time.Duration) (backend.Record, bool, error) {
	if b.failClaim {
		return backend.Record{}, false, fmt.Errorf("claiming %s: key %q is busy", rec.Key, rec.Key)
	}
	return b.MemoryBackend.Claim(ctx, rec, now, lease)
}

func (b *keyNamingBackend) Complete(ctx context.Context, rec backend.Record, now time.Time, ttl time.Duration) error {
	return fmt.Errorf("key %q: a record too large to keep (%s)", rec.Key, strconv.Quote(strconv.Quote(rec.Key)))
}

// Without RawKeys a key stays out of telemetry: not only out of the spans'
// attributes, but out of the status and the exception event of a span
// whose phase failed with a Backend's error that names it, where it stands
// as its hash.
func TestKeysStayOutOfSpanErrors(t *testing.T) {
	const key = `card-4242"4242\4242`
	for _, failClaim := range []bool{true, false} {
		spans := tracetest.NewSpanRecorder()
		obs, err := idemotel.NewObserver(idemotel.Options{
			TracerProvider: sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans)),
			MeterProvider:  sdkmetric.NewMeterProvider(),
		})
		require.NoError(t, err)
		s := idem.New[int](idem.Options{Backend: &keyNamingBackend{idemtest.NewMemoryBackend(), failClaim}, Observer: obs, SettleTimeout: 50 * time.Millisecond})
		_, _ = s.RunOnce(context.Background(), key, "p", func(context.Context) (int, error) { return 1, nil })
		_ = s.Close()

		failed := 0
		for _, sp := range spans.Ended() {
			texts := []string{sp.Status().Description}
			for _, ev := range sp.Events() {
				for _, kv := range ev.Attributes {
					texts = append(texts, kv.Value.String())
				}
			}
			if sp.Status().Description != "" {
				failed++
				assert.Contains(t, sp.Status().Description, "idem.key.hash:", "%s: the key stands as its hash", sp.Name())
			}
			for _, text := range texts {
				assert.NotContains(t, text, "4242", "failClaim %v: %s carries the key: %s", failClaim, sp.Name(), text)
			}
		}
		assert.Positive(t, failed, "failClaim %v: a span with the Backend's error", failClaim)
	}
}
