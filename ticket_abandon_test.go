package idem

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// keyReleasedByGC drops nothing itself: it runs the GC until key is no longer
// in flight in s, or gives up after d.
func keyReleasedByGC(s *Store[int], key string, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for s.table.inFlight(key) {
		if time.Now().After(deadline) {
			return false
		}
		runtime.GC()
		runtime.Gosched()
		time.Sleep(time.Millisecond)
	}
	return true
}

// A ticket begun with a cancellable ctx (every HTTP request's, every
// consumer's) whose Context was asked for, then dropped: the finalizer must
// release its key, as the Ticket doc promises.
func TestAbandonedTicketWithTimeoutIsReleased(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts Options
		loc  bool
	}{
		{"Begin", Options{SweepInterval: -1}, false},
		{"Begin+ExecutionTimeout", Options{SweepInterval: -1, ExecutionTimeout: time.Hour}, false},
		{"Begin+ExecutionTimeout100ms", Options{SweepInterval: -1, ExecutionTimeout: 100 * time.Millisecond}, false},
		{"BeginLocal", Options{SweepInterval: -1}, true},
		{"BeginLocal+ExecutionTimeout", Options{SweepInterval: -1, ExecutionTimeout: time.Hour}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := New[int](tc.opts) // not closed on failure: Close would wait for the key for ever
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			func() {
				var tk *Ticket[int]
				var err error
				if tc.loc {
					tk, err = s.beginLocal(ctx, "k", "p")
				} else {
					tk, err = s.Begin(ctx, "k", "p")
				}
				require.NoError(t, err)
				_ = tk.Context() // the work starts... and the caller forgets Finish
			}()
			if !keyReleasedByGC(s, "k", 10*time.Second) {
				t.Fatal("the abandoned ticket's key is still held after 10s of GCs: stranded for ever, and Close would hang")
			}
			_ = s.Close()
		})
	}
}

// Control: the same without calling Context is released (the existing test).
func TestAbandonedTicketWithoutContextIsReleased(t *testing.T) {
	s := New[int](Options{SweepInterval: -1})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	func() {
		_, err := s.Begin(ctx, "k", "p")
		require.NoError(t, err)
	}()
	require.True(t, keyReleasedByGC(s, "k", 10*time.Second))
	_ = s.Close()
}

// Control: an abandoned durable ticket whose Context was used.
func TestTicketAbandonedDurableTicketIsReleased(t *testing.T) {
	mem := newStubBackend()
	s := New[int](Options{SweepInterval: -1, Backend: mem})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	func() {
		tk, err := s.Begin(ctx, "k", "p")
		require.NoError(t, err)
		_ = tk.Context()
	}()
	require.True(t, keyReleasedByGC(s, "k", 10*time.Second))
	_ = s.Close()
}
