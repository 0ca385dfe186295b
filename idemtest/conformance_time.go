package idemtest

import (
	"context"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Leases and expiry, on the real clock.

func testLapsedLeaseIsInterrupted(t *testing.T, b backend.Backend) {
	ctx := context.Background()
	claim := claimKey(t, b, "k", shortLease)
	// Until the lease lapses the claim is pending and cannot be forgotten;
	// the lease is short, so only check while it surely holds.
	if rec, _ := get(t, b, "k"); time.Since(claim.CreatedAt) < shortLease/3 {
		assert.Equal(t, backend.StatePending, rec.State)
	}
	eventually(t, func() bool { rec, _ := get(t, b, "k"); return rec.State == backend.StateInterrupted },
		"a pending record whose lease lapsed must read as interrupted")
	// It keeps its LeaseUntil: a lapse alone is no proof of death (a
	// clock can step), and a record with none reads as one whose owner
	// is proven dead, which a Store takes over at once (Resume,
	// RetryInterrupted) rather than after watching it go unrenewed.
	rec, _ := get(t, b, "k")
	assert.False(t, rec.LeaseUntil.IsZero(), "Get reports a lapsed claim with its LeaseUntil, not as proven dead")

	got, won, err := b.Claim(ctx, request("k"), time.Now(), lease)
	require.NoError(t, err)
	assert.False(t, won, "an interrupted record is never taken over by Claim")
	assert.Equal(t, backend.StateInterrupted, got.State)
	assert.Equal(t, claim.Token, got.Token)
	assert.False(t, got.LeaseUntil.IsZero(), "Claim reports a lapsed claim with its LeaseUntil, not as proven dead")
	// Its owner's renewal brings it back: a lease judged lapsed by a clock
	// that stepped forward is still a live owner's, and a Store takes a
	// lapsed claim over only once it has seen it go unrenewed.
	require.NoError(t, b.Renew(ctx, "k", claim.Token, time.Now(), lease), "a lapsed lease is renewed by its owner")
	rec, _ = get(t, b, "k")
	assert.Equal(t, backend.StatePending, rec.State, "a renewed lease holds again")
	require.NoError(t, b.Renew(ctx, "k", claim.Token, time.Now(), shortLease))
	eventually(t, func() bool { rec, _ := get(t, b, "k"); return rec.State == backend.StateInterrupted },
		"the renewed lease lapses in its turn")
	assert.ErrorIs(t, b.Renew(ctx, "k", token(), time.Now(), lease), backend.ErrNotOwner, "only its owner renews a lapsed lease")
	require.NoError(t, b.Forget(ctx, "k", time.Now()), "an interrupted claim can be forgotten")
	_, ok := get(t, b, "k")
	assert.False(t, ok)

	// A lease finer than the backend keeps is rounded up, never down to
	// "no lease", which would leave the key pending for good.
	claimKey(t, b, "tiny", 900*time.Microsecond)
	eventually(t, func() bool { rec, _ := get(t, b, "tiny"); return rec.State == backend.StateInterrupted },
		"a 900 µs lease must lapse")
}

// An interrupted claim's owner may still record its outcome or release it:
// the token is what fences it, not the lease.
func testInterruptedCanBeSettled(t *testing.T, b backend.Backend) {
	ctx := context.Background()
	late := claimKey(t, b, "late", shortLease)
	gone := claimKey(t, b, "gone", shortLease)
	eventually(t, func() bool {
		a, _ := get(t, b, "late")
		c, _ := get(t, b, "gone")
		return a.State == backend.StateInterrupted && c.State == backend.StateInterrupted
	}, "the leases lapse")
	require.NoError(t, b.Complete(ctx, outcome(late, "v"), time.Now(), ttl))
	rec, _ := get(t, b, "late")
	assertOutcome(t, late, "v", rec)
	require.NoError(t, b.Release(ctx, "gone", gone.Token))
	_, ok := get(t, b, "gone")
	assert.False(t, ok)
}

func testCompletedRecordExpires(t *testing.T, b backend.Backend) {
	ctx := context.Background()
	done := claimAndComplete(t, b, "k", "v", shortTTL)
	if time.Since(done.CreatedAt) < shortTTL/3 {
		early := request("k")
		_, won, err := b.Claim(ctx, early, time.Now(), lease)
		require.NoError(t, err)
		// Judged when the claim has returned: a claim slow enough to reach
		// the backend after the TTL may rightly win.
		if time.Since(done.CreatedAt) < shortTTL/3 {
			assert.False(t, won, "claimed before expiry")
		}
		if won {
			require.NoError(t, b.Release(ctx, "k", early.Token))
		}
	}
	eventually(t, func() bool { _, ok := get(t, b, "k"); return !ok }, "an expired record is not returned")
	fresh := request("k")
	got, won, err := b.Claim(ctx, fresh, time.Now(), lease)
	require.NoError(t, err)
	assert.True(t, won, "an expired record must give way to a new claim")
	assert.Equal(t, fresh.Token, got.Token)
	assert.Equal(t, backend.StatePending, got.State)
	assert.Empty(t, got.Value, "the new claim holds none of the old outcome")
}

// Of many concurrent claims of an expired key, exactly one takes it over.
func testExpiredTakeoverHasOneWinner(t *testing.T, b backend.Backend) {
	claimAndComplete(t, b, "k", "old", shortTTL)
	eventually(t, func() bool { _, ok := get(t, b, "k"); return !ok }, "the record expires")
	const claimers = 50
	start := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var winners []string
	tokens := make([]string, claimers)
	for i := range tokens {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := request("k")
			<-start
			got, won, err := b.Claim(context.Background(), req, time.Now(), lease)
			if !assert.NoError(t, err) {
				return
			}
			tokens[i] = got.Token
			if won {
				mu.Lock()
				winners = append(winners, req.Token)
				mu.Unlock()
			}
		}()
	}
	close(start)
	wg.Wait()
	require.Len(t, winners, 1, "exactly one claim takes an expired key over")
	for _, tok := range tokens {
		assert.Equal(t, winners[0], tok, "every claim sees the winner's record")
	}
}

// A claim that took over an expired record must not be swept with the old
// record's expiry.
func testSweepSparesClaimOverExpired(t *testing.T, b backend.Backend) {
	ctx := context.Background()
	claimAndComplete(t, b, "k", "old", shortTTL)
	eventually(t, func() bool { _, ok := get(t, b, "k"); return !ok }, "the record expires")
	fresh := claimKey(t, b, "k", lease)
	_, err := b.Sweep(ctx, time.Now(), 100)
	require.NoError(t, err)
	got, ok := get(t, b, "k")
	require.True(t, ok, "the new claim was swept away")
	assert.Equal(t, fresh.Token, got.Token)
}

func testSweepDeletesExpiredOnly(t *testing.T, b backend.Backend) {
	ctx := context.Background()
	for i := range 10 {
		claimAndComplete(t, b, fmt.Sprint("short-", i), "v", shortTTL)
	}
	claimAndComplete(t, b, "long", "v", ttl)
	claimKey(t, b, "pending", shortLease) // lapses, and is still never swept
	eventually(t, func() bool {
		for i := range 10 {
			if _, ok := get(t, b, fmt.Sprint("short-", i)); ok {
				return false
			}
		}
		rec, _ := get(t, b, "pending")
		return rec.State == backend.StateInterrupted
	}, "the short records expire and the pending lease lapses")
	if lister, ok := b.(backend.Lister); ok && sweepable(b, 1) == 0 {
		// A backend that says its records expire by themselves must not
		// keep them: they stop being listed, with no Sweep.
		eventually(t, func() bool {
			listed := 0
			require.NoError(t, lister.Each(ctx, func(rec backend.Record) error {
				if strings.HasPrefix(rec.Key, "short-") {
					listed++
				}
				return nil
			}))
			return listed == 0
		}, "the expired records of a SelfExpiring backend are gone without a Sweep")
	}

	n, err := b.Sweep(ctx, time.Now(), 4)
	require.NoError(t, err)
	assert.Equal(t, sweepable(b, 4), n, "Sweep must respect its limit")
	n, err = b.Sweep(ctx, time.Now(), 100)
	require.NoError(t, err)
	assert.Equal(t, sweepable(b, 6), n, "the rest of the expired records")
	n, err = b.Sweep(ctx, time.Now(), 100)
	require.NoError(t, err)
	assert.Equal(t, 0, n, "nothing left to sweep")
	for _, key := range []string{"long", "pending"} {
		_, ok := get(t, b, key)
		assert.True(t, ok, "%s must not be swept", key)
	}
}

// A limit of zero or less sweeps nothing (backend.Backend's Sweep doc),
// and never panics.
func testSweepLimitNotPositive(t *testing.T, b backend.Backend) {
	ctx := context.Background()
	for i := range 3 {
		claimAndComplete(t, b, fmt.Sprint("short-", i), "v", shortTTL)
	}
	eventually(t, func() bool {
		for i := range 3 {
			if _, ok := get(t, b, fmt.Sprint("short-", i)); ok {
				return false
			}
		}
		return true
	}, "the records expire")
	for _, limit := range []int{0, -1, math.MinInt} {
		var n int
		var err error
		require.NotPanics(t, func() { n, err = b.Sweep(ctx, time.Now(), limit) }, "Sweep with limit %d", limit)
		require.NoError(t, err, "Sweep with limit %d", limit)
		assert.Zero(t, n, "Sweep with limit %d deleted records", limit)
	}
	n, err := b.Sweep(ctx, time.Now(), 100)
	require.NoError(t, err)
	assert.Equal(t, sweepable(b, 3), n, "the expired records are all still there to sweep: a limit of zero or less deleted some")
}

// sweepable is how many of n expired records b's Sweep deletes: all of
// them, or none for a backend whose records vanish at their expiry by
// themselves (backend.SelfExpiring).
func sweepable(b backend.Backend, n int) int {
	if _, ok := b.(backend.SelfExpiring); ok {
		return 0
	}
	return n
}

func testGetAndForget(t *testing.T, b backend.Backend) {
	ctx := context.Background()
	_, ok := get(t, b, "absent")
	assert.False(t, ok)
	assert.NoError(t, b.Forget(ctx, "absent", time.Now()))

	done := claimAndComplete(t, b, "done", "v", ttl)
	got, ok := get(t, b, "done")
	require.True(t, ok)
	assertOutcome(t, done, "v", got)
	require.NoError(t, b.Forget(ctx, "done", time.Now()))
	_, ok = get(t, b, "done")
	assert.False(t, ok)
	claimKey(t, b, "done", lease) // a forgotten key can be claimed again

	claimKey(t, b, "busy", lease)
	assert.ErrorIs(t, b.Forget(ctx, "busy", time.Now()), idem.ErrInProgress, "a claim whose lease holds cannot be forgotten")
	_, ok = get(t, b, "busy")
	assert.True(t, ok)

	// A claim with no lease (lease 0) never lapses: its owner may be at
	// work for as long as it takes, so it is as live as one whose lease
	// holds.
	claimKey(t, b, "leaseless", 0)
	assert.ErrorIs(t, b.Forget(ctx, "leaseless", time.Now()), idem.ErrInProgress, "a claim with no lease cannot be forgotten")
	got, ok = get(t, b, "leaseless")
	assert.True(t, ok)
	assert.Equal(t, backend.StatePending, got.State, "a claim with no lease stays pending")
}

// century is the longest lease or TTL a Store sends.
const century = 100 * 365 * 24 * time.Hour

// A century-long lease and TTL, what a Store sends for "for ever", must
// not overflow into the past.
func testCenturyLongDurations(t *testing.T, b backend.Backend) {
	ctx := context.Background()
	claim := claimKey(t, b, "k", century)
	rec, _ := get(t, b, "k")
	assert.Equal(t, backend.StatePending, rec.State, "a century-long lease lapsed at once")
	require.NoError(t, b.Renew(ctx, "k", claim.Token, time.Now(), century))
	require.NoError(t, b.Complete(ctx, outcome(claim, "v"), time.Now(), century))
	got, won, err := b.Claim(ctx, request("k"), time.Now(), lease)
	require.NoError(t, err)
	assert.False(t, won, "a century-long TTL expired at once")
	assertOutcome(t, claim, "v", got)
	n, err := b.Sweep(ctx, time.Now(), 100)
	require.NoError(t, err)
	assert.Zero(t, n)
}

// testSweepOldestFirst: Sweep with a limit deletes the records that
// expired first, as its doc says, so that a sweeper bounded per run never
// starves the oldest records behind newer ones. One TTL, as a Store sends:
// a backend may order by an instant that keeps that order only among
// records of one TTL (postgres does).
func testSweepOldestFirst(t *testing.T, b backend.Backend) {
	lister, ok := b.(backend.Lister)
	if !ok {
		t.Skip("the backend cannot list its records")
	}
	ctx := context.Background()
	claimAndComplete(t, b, "early", "v", shortTTL) // expires first
	claimAndComplete(t, b, "late", "v", shortTTL)  // expires second
	eventually(t, func() bool {
		_, late := get(t, b, "late")
		return !late
	}, "both records expire")
	n, err := b.Sweep(ctx, time.Now(), 1)
	require.NoError(t, err)
	require.Equal(t, sweepable(b, 1), n)
	left := map[string]bool{}
	require.NoError(t, lister.Each(ctx, func(rec backend.Record) error {
		left[rec.Key] = true
		return nil
	}))
	// (A backend whose records also expire by themselves, as Redis keys
	// do, may list neither.)
	assert.False(t, left["early"] && !left["late"], "Sweep deleted a record that expired later before the oldest")
}
