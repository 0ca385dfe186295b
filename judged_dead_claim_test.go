package idem_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A claim whose lease lapsed reads as interrupted on a backend that keeps
// the store's clock (bolt, sqlite, MemoryBackend), and a store takes it
// for a dead owner's only once it has watched it unrenewed for a whole
// lease within one call. Once a store has judged the owner dead (a
// patient caller got ErrOutcomeUnknown), that verdict is the key's: later
// callers, in this store or another, whose ctx is shorter than a lease
// get ErrOutcomeUnknown at once, as for any interrupted key, not
// ErrInProgress for as long as no patient caller comes again. (Found by
// the model, bolt's TestModel: a key whose owner died in a crash answered
// ErrInProgress to every 400 ms call, the same store having answered
// ErrOutcomeUnknown to a 2 s one a moment before.)
func TestAClaimJudgedDeadStaysJudgedForShortCallers(t *testing.T) {
	const lease = 300 * time.Millisecond
	clock := idemtest.NewClock(time.Now().UTC().Truncate(time.Second))
	mem := idemtest.NewMemoryBackend()
	// The dead owner's claim: made, never renewed, never settled; lapsed.
	_, won, err := mem.Claim(context.Background(), backend.Record{Key: "k", Fingerprint: mustFingerprint(t, "p"), Token: "dead", State: backend.StatePending}, clock.Now(), lease)
	require.NoError(t, err)
	require.True(t, won)
	clock.Advance(2 * lease)

	quiet := slog.New(slog.DiscardHandler)
	s := idem.New[string](idem.Options{Backend: mem, Now: clock.Now, Lease: lease, Logger: quiet})
	defer closeWithin(t, s, 5*time.Second)
	other := idem.New[string](idem.Options{Backend: mem, Now: clock.Now, Lease: lease, Logger: quiet})
	defer closeWithin(t, other, 5*time.Second)
	fn := func(context.Context) (string, error) { return "again", nil }

	patient, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = s.RunOnce(patient, "k", "p", fn)
	require.ErrorIs(t, err, idem.ErrOutcomeUnknown, "a caller that waits a lease judges the owner dead")

	for name, st := range map[string]*idem.Store[string]{"the store that judged": s, "another store": other} {
		short, cancel := context.WithTimeout(context.Background(), lease/3)
		_, err := st.RunOnce(short, "k", "p", fn)
		cancel()
		assert.ErrorIs(t, err, idem.ErrOutcomeUnknown, "%s, to a caller shorter than a lease, after the owner was judged dead", name)
	}
}
