package idem_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type phaseKey struct{}

// phaseSeen wraps a Backend and notes the Observer's phase each outcome's
// write (Complete, Release) was sent under.
type phaseSeen struct {
	backend.Backend
	mu     sync.Mutex
	phases map[string]any
}

func (p *phaseSeen) note(call string, ctx context.Context) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.phases[call] = ctx.Value(phaseKey{})
}

func (p *phaseSeen) Complete(ctx context.Context, rec backend.Record, now time.Time, ttl time.Duration) error {
	p.note("Complete", ctx)
	return p.Backend.Complete(ctx, rec, now, ttl)
}

func (p *phaseSeen) Release(ctx context.Context, key, token string) error {
	p.note("Release", ctx)
	return p.Backend.Release(ctx, key, token)
}

// The Backend writes a durable claim's outcome under the context the
// Observer's "idem.record" span returned, as Observer.Span says the phase
// runs: a tracing Backend's statements belong to that span.
func TestOutcomeIsWrittenUnderTheRecordSpansContext(t *testing.T) {
	for _, c := range []struct {
		name, call string
		err        error
	}{
		{"completed", "Complete", nil},
		{"released", "Release", errors.New("not final: released")},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := &phaseSeen{Backend: idemtest.NewMemoryBackend(), phases: map[string]any{}}
			obs := &idem.Observer{Span: func(ctx context.Context, phase, _ string) (context.Context, func(error)) {
				return context.WithValue(ctx, phaseKey{}, phase), func(error) {}
			}}
			s := durableStore(t, b, idem.Options{Observer: obs})
			_, err := s.RunOnce(context.Background(), "k", nil, func(context.Context) (order, error) {
				return order{ID: 1}, c.err
			})
			require.ErrorIs(t, err, c.err)
			b.mu.Lock()
			defer b.mu.Unlock()
			require.Contains(t, b.phases, c.call)
			assert.Equal(t, "idem.record", b.phases[c.call])
		})
	}
}
