package idemtest

import (
	"context"
	"testing"
	"time"

	"github.com/seed094d4201/idem/backend"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// testSweepSparesUntilExpiry, by the caller's clock: a Sweep whose now is
// just before a record's expiry leaves it. The TTL is long, so the record
// is nowhere near expiry by a server's clock either: a backend that judges
// by its server's clock ignores now and deletes nothing, and one that
// judges by now must not act early by as little as a millisecond (a
// sweeper that did would delete an outcome a duplicate still needs, and
// the operation would run again).
func testSweepSparesUntilExpiry(t *testing.T, b backend.Backend) {
	ctx := context.Background()
	claimAndComplete(t, b, "k", "v", ttl)
	rec, ok := get(t, b, "k")
	require.True(t, ok)
	require.False(t, rec.ExpiresAt.IsZero(), "a completed record has an expiry")
	for _, early := range []time.Duration{time.Second, 100 * time.Millisecond, time.Millisecond} {
		now := rec.ExpiresAt.Add(-early)
		n, err := b.Sweep(ctx, now, 100)
		require.NoError(t, err)
		assert.Zero(t, n, "Sweep at %v before the expiry deleted records", early)
		_, ok := get(t, b, "k")
		require.True(t, ok, "Sweep at %v before the expiry deleted the record", early)
	}
}

// sweepLife is the TTL testSweepWaitsForExpiry gives its record: long
// enough to sweep many times in the last second before its expiry.
const sweepLife = 2 * time.Second

// testSweepWaitsForExpiry, by whichever clock the backend judges: a
// record completed with a TTL of a few seconds is swept again and again,
// each time with now the real time, until its TTL has nearly run out on
// this host's clock. Each Sweep (and the Get after it) returned within
// that time of the moment before Complete was sent, so it ran before the
// expiry by the server's clock as well as by now: the record must stand
// after every one. A Sweep that acts even a fraction of a second early
// deletes it in the last stretch.
func testSweepWaitsForExpiry(t *testing.T, b backend.Backend) {
	ctx := context.Background()
	claim := claimKey(t, b, "k", lease)
	sent := time.Now()
	require.NoError(t, b.Complete(ctx, outcome(claim, "v"), time.Now(), sweepLife))
	// A margin for the server's clock running a little faster than this
	// host's over the TTL, as NTP's slewing allows.
	const margin = 50 * time.Millisecond
	sweeps := 0
	for {
		n, err := b.Sweep(ctx, time.Now(), 100)
		require.NoError(t, err)
		_, ok := get(t, b, "k")
		if time.Since(sent) >= sweepLife-margin {
			break
		}
		sweeps++
		require.Zero(t, n, "a Sweep %v after Complete, with a TTL of %v, deleted records", time.Since(sent), sweepLife)
		require.True(t, ok, "the record was gone %v after Complete, with a TTL of %v", time.Since(sent), sweepLife)
		time.Sleep(10 * time.Millisecond)
	}
	require.Positive(t, sweeps, "no Sweep returned within the TTL: the backend is too slow to judge")
}
