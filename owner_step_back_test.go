package idem_test

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A live owner renews while the clock stands stepped back by hours: the
// record's lease now ends before the claim was made, as an owner's own
// lapse or a transactional claim's does. Once the clock comes back, the
// claim reads as lapsed. That is no proof its owner is dead: another store
// must watch it as any lapsed claim, not take it over at once while the
// owner still trusts it. (The owner's later renewals are held up, so that
// only the watch can tell.)
func TestClockStepBackDuringARenewalIsNoProofOfDeath(t *testing.T) {
	const lease = 300 * time.Millisecond
	clock := idemtest.NewClock(time.Now().UTC().Truncate(time.Second))
	mem := idemtest.NewMemoryBackend()
	quiet := slog.New(slog.DiscardHandler)
	var armed, held atomic.Bool
	landed, unblock := make(chan struct{}), make(chan struct{})
	var once sync.Once
	b := idemtest.Faulty{Backend: mem,
		Fail: func(op string) error {
			if op == "Renew" && held.Load() {
				<-unblock // later renewals are held up
			}
			return nil
		},
		Lose: func(op string) error {
			if op != "Renew" || !armed.Load() {
				return nil
			}
			rec, _, _ := mem.Get(context.Background(), "k", clock.Now())
			if rec.LeaseUntil.Before(rec.CreatedAt) {
				held.Store(true)
				once.Do(func() { close(landed) })
			}
			return nil
		}}
	s0 := idem.New[string](idem.Options{Backend: b, Now: clock.Now, Lease: lease, Logger: quiet})
	defer closeWithin(t, s0, 5*time.Second)
	defer close(unblock)
	s1 := idem.New[string](idem.Options{Backend: mem, Now: clock.Now, Lease: lease, RetryInterrupted: true, Logger: quiet})
	defer closeWithin(t, s1, 5*time.Second)

	octx, first := ownerRunning(s0, "k")
	clock.Advance(-3 * time.Hour)
	armed.Store(true)
	<-landed
	clock.Advance(3 * time.Hour)

	v, overlapped, err := takeOver(s1, "k", octx)
	require.NoError(t, err)
	assert.Equal(t, "second", v)
	assert.False(t, overlapped, "the key was taken from its live owner at once: fn ran twice at once")
	assert.ErrorIs(t, <-first, idem.ErrLeaseLost)
}
