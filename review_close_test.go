package idem_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// hangingWrites is a backend whose writes after the claim (Complete,
// Release, Renew) never answer: each returns only when its ctx ends, as a
// client does against a server that has stopped replying.
type hangingWrites struct{ backend.Backend }

func (hangingWrites) Complete(ctx context.Context, _ backend.Record, _ time.Time, _ time.Duration) error {
	<-ctx.Done()
	return ctx.Err()
}

func (hangingWrites) Release(ctx context.Context, _, _ string) error {
	<-ctx.Done()
	return ctx.Err()
}

func (hangingWrites) Renew(ctx context.Context, _, _ string, _ time.Time, _ time.Duration) error {
	<-ctx.Done()
	return ctx.Err()
}

// Close against a backend that stops answering once keys are claimed: an
// outcome memory holds while its Complete hangs (its lease's renewals
// hanging too), and a release of unknown fate still being tried. Close
// returns one settle timeout after the executions ended, however the
// background work is placed then, and Shutdown says what it gave up.
func TestReviewCloseReturnsWithinOneSettleTimeoutWhenWritesHang(t *testing.T) {
	const settle = 300 * time.Millisecond
	b := hangingWrites{idemtest.NewMemoryBackend()}
	s := idem.New[order](idem.Options{Backend: b, Lease: 90 * time.Millisecond, SettleTimeout: settle, Logger: slog.New(slog.DiscardHandler)})
	v, err := s.RunOnce(context.Background(), "done", "p", func(context.Context) (order, error) { return order{1, 1}, nil })
	require.NoError(t, err, "answered as recorded: memory holds it")
	assert.Equal(t, order{1, 1}, v)
	_, err = s.RunOnce(context.Background(), "failed", "p", func(context.Context) (order, error) {
		return order{}, errors.New("before commit")
	})
	require.Error(t, err)

	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- s.Shutdown(context.Background()) }()
	select {
	case err = <-done:
	case <-time.After(settle + 5*time.Second):
		t.Fatal("Close did not return")
	}
	took := time.Since(start)
	assert.Error(t, err, "Shutdown says the outcome was not recorded")
	assert.Less(t, took, settle+2*time.Second, "Close waited well past one settle timeout")
	closeWithin(t, s, time.Second) // and a later Close returns at once
}
