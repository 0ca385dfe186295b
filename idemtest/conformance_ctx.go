package idemtest

import (
	"context"
	"testing"
	"time"

	"github.com/seed094d4201/idem/backend"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// testCancelledContext: every method of a Backend and of its optional
// interfaces, given a ctx that has already ended (cancelled, or past its
// deadline), is refused before it writes or sends anything: its error
// matches the ctx's error and backend.ErrRefused, and no record changes.
// A bare ctx error would leave the Store reading back, and releasing
// later, a write that cannot land, and Close waiting for it.
func testCancelledContext(t *testing.T, b backend.Backend) {
	live := claimKey(t, b, "live", lease)
	done := claimAndComplete(t, b, "done", "v", ttl)
	claimAndComplete(t, b, "expired", "v", shortTTL) // for Sweep to leave
	lapsed := claimKey(t, b, "lapsed", shortLease)   // for Resume to leave
	eventually(t, func() bool {
		_, kept := get(t, b, "expired")
		rec, _ := get(t, b, "lapsed")
		return !kept && rec.State == backend.StateInterrupted
	}, "the short TTL and the short lease run out")

	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	late, cancelLate := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancelLate()
	for _, ctx := range []context.Context{cancelled, late} {
		refused := func(method string, err error) {
			t.Helper()
			assert.ErrorIs(t, err, ctx.Err(), "%s with an ended ctx keeps its ctx's error", method)
			assert.ErrorIs(t, err, backend.ErrRefused, "%s with an ended ctx is refused", method)
		}
		now := time.Now()
		_, _, err := b.Claim(ctx, request("new"), now, lease)
		refused("Claim", err)
		refused("Complete", b.Complete(ctx, outcome(live, "v"), now, ttl))
		refused("Release", b.Release(ctx, "live", live.Token))
		refused("Renew", b.Renew(ctx, "live", live.Token, now, lease))
		_, _, err = b.Get(ctx, "live", now)
		refused("Get", err)
		refused("Forget", b.Forget(ctx, "done", now))
		_, err = b.Sweep(ctx, now, 100)
		refused("Sweep", err)
		if l, ok := b.(backend.Lister); ok {
			called := false
			refused("Each", l.Each(ctx, func(backend.Record) error { called = true; return nil }))
			assert.False(t, called, "Each with an ended ctx called fn")
		}
		if st, ok := b.(backend.Stepper); ok {
			refused("RecordStep", st.RecordStep(ctx, "live", live.Token, backend.Step{Name: "s", Value: []byte("v")}, now))
			_, err = st.Resume(ctx, "lapsed", lapsed.Token, token(), now, lease)
			refused("Resume", err)
		}
	}

	_, ok := get(t, b, "new")
	assert.False(t, ok, "a refused Claim wrote a record")
	rec, _ := get(t, b, "live")
	assert.Equal(t, backend.StatePending, rec.State, "a refused Complete or Release changed the claim")
	assert.Equal(t, live.Token, rec.Token)
	assert.Equal(t, live.LeaseUntil.UnixMilli(), rec.LeaseUntil.UnixMilli(), "a refused Renew moved the lease")
	assert.Empty(t, rec.Steps, "a refused RecordStep recorded a step")
	rec, _ = get(t, b, "done")
	assertOutcome(t, done, "v", rec)
	rec, _ = get(t, b, "lapsed")
	assert.Equal(t, backend.StateInterrupted, rec.State, "a refused Resume took the interrupted claim over")
	assert.Equal(t, lapsed.Token, rec.Token, "a refused Resume took the interrupted claim over")
	n, err := b.Sweep(context.Background(), time.Now(), 100)
	require.NoError(t, err)
	assert.Equal(t, sweepable(b, 1), n, "a refused Sweep deleted the expired record")
}
