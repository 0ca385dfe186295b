package idem_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemtest"
)

// An outcome the Backend took only later, after the clock had stepped
// back, is still remembered for a TTL from when it was known: once the
// clock steps forward again, the key replays. Its expiry was reckoned from
// the stepped-back clock when the write landed, and a step forward as
// large made the key run again seconds after it ran (the bolt model,
// seed 17127444977338853827).
func TestALateWriteKeepsAWholeTTL(t *testing.T) {
	var offset atomic.Int64
	now := func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }
	var down atomic.Bool
	down.Store(true)
	mem := idemtest.NewMemoryBackend()
	b := idemtest.Faulty{Backend: mem, Fail: func(op string) error {
		if op == "Complete" && down.Load() {
			return errLost
		}
		return nil
	}}
	s := idem.New[int](idem.Options{Backend: b, Now: now, TTL: time.Hour, SweepInterval: -1,
		SettleTimeout: 20 * time.Millisecond})
	defer closeWithin(t, s, 5*time.Second)
	var runs atomic.Int32
	fn := func(context.Context) (int, error) { return int(runs.Add(1)), nil }
	if v, err := s.RunOnce(context.Background(), "k", "p", fn); v != 1 || err != nil {
		t.Fatalf("first call = %d, %v", v, err)
	}
	offset.Add(int64(-2 * time.Hour)) // the clock steps back
	down.Store(false)                 // and the held outcome is written
	waitFor(t, func() bool { return s.Len() == 0 }, "the held outcome to be recorded")
	offset.Add(int64(2 * time.Hour)) // and forward again: no time has passed
	if v, err := s.RunOnce(context.Background(), "k", "p", fn); v != 1 || err != nil || runs.Load() != 1 {
		t.Fatalf("a call seconds later = %d, %v after %d runs; want the first run's 1, replayed", v, err, runs.Load())
	}
}
