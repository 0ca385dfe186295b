package idemtest

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A consumer killed after its side effect and before recording it leaves
// its key interrupted. Resolved as done, the key replays the outcome the
// operator gave to a late duplicate, which does not run; resolved as a
// final error, it replays that error. Only an interrupted key can be
// resolved.
func testResolveInterrupted(c *contract) {
	t := c.t
	c.needBackend()
	ctx := context.Background()
	c.deadClaims("killed-", "applied", "declined")

	s := c.store(idem.Options{})
	require.NoError(t, s.Resolve(ctx, "applied", receipt{N: 3}, nil))
	require.NoError(t, s.Resolve(ctx, "declined", receipt{}, errors.New("out of stock")))

	var calls atomic.Int32
	v, err := c.run(s, c.bounded(), "applied", "p", counting(&calls))
	require.NoError(t, err)
	assert.Equal(t, receipt{N: 3}, v, "the late duplicate replays the operator's outcome")
	_, err = c.run(s, c.bounded(), "declined", "p", counting(&calls))
	assert.True(t, idem.IsFinal(err), "a resolved error is final: %v", err)
	assert.EqualError(t, err, "out of stock")
	_, err = c.run(s, c.bounded(), "applied", "another payload", counting(&calls))
	assert.ErrorIs(t, err, idem.ErrPayloadMismatch, "the key keeps its payload")
	assert.Zero(t, calls.Load(), "a resolved key never runs")

	other := c.store(idem.Options{}) // another process sees it too
	v, err = c.run(other, c.bounded(), "applied", "p", counting(&calls))
	require.NoError(t, err)
	assert.Equal(t, receipt{N: 3}, v)

	assert.ErrorIs(t, s.Resolve(ctx, "applied", receipt{N: 4}, nil), idem.ErrNotInterrupted, "an outcome is not overwritten")
	assert.ErrorIs(t, s.Resolve(ctx, "never-claimed", receipt{}, nil), idem.ErrNotInterrupted)
	assert.ErrorIs(t, s.Resolve(ctx, "bad\x00key", receipt{}, nil), idem.ErrInvalidKey)

	// A key in flight, in another store under a live lease.
	holder := c.store(idem.Options{Lease: time.Minute})
	tk, err := holder.Begin(ctx, "live", "p")
	require.NoError(t, err)
	assert.ErrorIs(t, s.Resolve(ctx, "live", receipt{}, nil), idem.ErrInProgress)
	assert.ErrorIs(t, holder.Resolve(ctx, "live", receipt{}, nil), idem.ErrInProgress, "in flight in this very store")
	tk.Release()
	assert.Zero(t, calls.Load())
}

// Reconciliation code lists the interrupted keys from a Store, first and
// by state, then resolves them.
func testRecordsListsInterruptedFirst(c *contract) {
	t := c.t
	c.needBackend()
	if _, ok := c.b.(backend.Lister); !ok {
		t.Skip("the backend does not implement backend.Lister")
	}
	ctx := context.Background()
	s := c.store(idem.Options{Lease: time.Minute})
	var calls atomic.Int32
	for _, key := range []string{"a-done", "z-done"} {
		_, err := c.run(s, c.bounded(), key, "p", counting(&calls))
		require.NoError(t, err)
	}
	tk, err := s.Begin(ctx, "m-live", "p")
	require.NoError(t, err)
	defer tk.Release()
	fp, err := idem.DefaultFingerprint("p")
	require.NoError(t, err)
	_, _, err = c.b.Claim(ctx, backend.Record{Key: "k-dead", Fingerprint: fp, Token: "killed", State: backend.StatePending}, time.Now(), 50*time.Millisecond)
	require.NoError(t, err)
	require.True(t, poll(func() bool { rec, ok := c.record("k-dead"); return ok && rec.State == backend.StateInterrupted }))

	var keys []string
	var states []backend.RecordState
	for rec, err := range s.Records(ctx) {
		require.NoError(t, err)
		keys = append(keys, rec.Key)
		states = append(states, rec.State)
	}
	require.Len(t, keys, 4, "%v", keys)
	assert.Equal(t, "k-dead", keys[0], "interrupted keys come first: %v", keys)
	assert.Equal(t, backend.StateInterrupted, states[0])
	assert.ElementsMatch(t, []string{"a-done", "z-done", "m-live"}, keys[1:])

	var interrupted []string
	for rec, err := range s.Records(ctx, backend.StateInterrupted) {
		require.NoError(t, err)
		interrupted = append(interrupted, rec.Key)
		require.NoError(t, s.Resolve(ctx, rec.Key, receipt{N: 42}, nil))
	}
	assert.Equal(t, []string{"k-dead"}, interrupted)
	v, err := c.run(s, c.bounded(), "k-dead", "p", counting(&calls))
	require.NoError(t, err)
	assert.Equal(t, receipt{N: 42}, v)
	assert.Equal(t, int32(2), calls.Load())
	for rec, err := range s.Records(ctx, backend.StatePending) {
		require.NoError(t, err)
		assert.Equal(t, "m-live", rec.Key, "only the key in flight is pending")
	}
}
