package idem_test

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A Backend whose Complete ends the goroutine (runtime.Goexit) once, before
// the write lands, and then behaves: the outcome is recorded in the
// background, as one the Backend failed to take is, not held in memory for
// as long as the store lives while other processes wait on its claim (and,
// once it closes, find the key interrupted and, with RetryInterrupted, run
// it again).
func TestCompleteThatExitsIsRecordedLater(t *testing.T) {
	mem := idemtest.NewMemoryBackend()
	var armed atomic.Bool
	armed.Store(true)
	b := idemtest.Faulty{Backend: mem, Fail: func(op string) error {
		if op == "Complete" && armed.CompareAndSwap(true, false) {
			misbehave("goexit", op)
		}
		return nil
	}}
	quiet := slog.New(slog.DiscardHandler)
	s := idem.New[string](idem.Options{Backend: b, Lease: 200 * time.Millisecond, Logger: quiet})
	defer closeWithin(t, s, 5*time.Second)
	var runs atomic.Int64
	fn := func(context.Context) (string, error) { runs.Add(1); return "v", nil }
	escaped, exited := isolated(func() { _, _ = s.RunOnce(context.Background(), "k", "p", fn) })
	require.Nil(t, escaped)
	require.True(t, exited)

	// Another process, with RetryInterrupted, gets the outcome.
	other := idem.New[string](idem.Options{Backend: mem, Lease: 200 * time.Millisecond, RetryInterrupted: true, Logger: quiet})
	defer closeWithin(t, other, 5*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	v, err := other.RunOnce(ctx, "k", "p", fn)
	require.NoError(t, err, "the outcome was never recorded")
	assert.Equal(t, "v", v)
	assert.Equal(t, int64(1), runs.Load())
	rec, _, err := mem.Get(context.Background(), "k", time.Now())
	require.NoError(t, err)
	assert.Equal(t, backend.StateCompleted, rec.State)

	// This store replays it too, and closing it leaves nothing unrecorded.
	v, err = s.RunOnce(context.Background(), "k", "p", fn)
	require.NoError(t, err)
	assert.Equal(t, "v", v)
	assert.NoError(t, s.Shutdown(context.Background()))
}
