// Package idemtest helps test code built on idem: a conformance suite that
// every backend.Backend must pass, an in-memory reference Backend, and a
// wrapper that injects backend failures.
package idemtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Run checks that the Backend made by newBackend keeps the contract
// documented on backend.Backend. newBackend is called once per subtest and must
// return an empty backend; register its cleanup with t.Cleanup.
//
// The suite runs on the real clock, with leases and TTLs of a fraction of a
// second that it waits out by polling, so that it checks a backend that
// judges time by its own server's clock as well as one that takes the now
// it is given (which the suite passes as time.Now()). A shared backend also
// runs RunShared, and RunOperator under settings its operator may choose.
func Run(t *testing.T, newBackend func(t *testing.T) backend.Backend) {
	for _, tc := range []struct {
		name string
		test func(*testing.T, backend.Backend)
	}{
		{"ClaimHasOneWinner", testClaimHasOneWinner},
		{"ClaimReturnsExisting", testClaimReturnsExisting},
		{"ClaimAnswersWellFormed", testClaimAnswersWellFormed},
		{"CompleteChecksToken", testCompleteChecksToken},
		{"CompleteKeepsFingerprint", testCompleteKeepsFingerprint},
		{"ReleaseChecksToken", testReleaseChecksToken},
		{"RenewChecksToken", testRenewChecksToken},
		{"LapsedLeaseIsInterrupted", testLapsedLeaseIsInterrupted},
		{"CenturyLongDurations", testCenturyLongDurations},
		{"InterruptedCanBeSettled", testInterruptedCanBeSettled},
		{"CompletedRecordExpires", testCompletedRecordExpires},
		{"ExpiredTakeoverHasOneWinner", testExpiredTakeoverHasOneWinner},
		{"SweepSparesClaimOverExpired", testSweepSparesClaimOverExpired},
		{"SweepRacesTakeover", testSweepRacesTakeover},
		{"SweepDeletesExpiredOnly", testSweepDeletesExpiredOnly},
		{"SweepOldestFirst", testSweepOldestFirst},
		{"SweepLimitNotPositive", testSweepLimitNotPositive},
		{"SweepSparesUntilExpiry", testSweepSparesUntilExpiry},
		{"SweepWaitsForExpiry", testSweepWaitsForExpiry},
		{"GetAndForget", testGetAndForget},
		{"RecordsRoundTrip", testRecordsRoundTrip},
		{"EachPagesAndAllowsCalls", testEachPagesAndAllowsCalls},
		{"EachReturnsEveryField", testEachReturnsEveryField},
		{"ManyKeysConcurrently", testManyKeysConcurrently},
		{"RepeatedWritesAfterLostReplies", testRepeatedWrites},
		{"CancelledContextWritesNothing", testCancelledContext},
		{"EndingContextRefusesOnlyWhatItDidNotWrite", testEndingContext},
		{"BuffersNotShared", testBuffersNotShared},
		{"CallsAfterClose", testCallsAfterClose},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.test(t, newBackend(t)) })
	}
}

// Durations the suite uses: a lease and a TTL that hold for the length of a
// subtest, and short ones that it waits out.
const (
	lease      = time.Minute
	ttl        = time.Hour
	shortLease = 150 * time.Millisecond
	shortTTL   = 150 * time.Millisecond
)

func token() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// request returns what a Store passes to Claim for key: its fingerprint and
// a fresh token.
func request(key string) backend.Record {
	return backend.Record{Key: key, Fingerprint: idem.Fingerprint{1, 2, 3, byte(len(key))}, Token: token(), State: backend.StatePending}
}

// claimKey claims key with the given lease, requires that the claim won, and
// returns the record Claim returned.
func claimKey(t *testing.T, b backend.Backend, key string, lease time.Duration) backend.Record {
	t.Helper()
	req := request(key)
	got, won, err := b.Claim(context.Background(), req, time.Now(), lease)
	require.NoError(t, err)
	require.True(t, won, "claim of a free key %q", key)
	assertWellFormed(t, req, got, won)
	return got
}

// outcome returns claim's record with an outcome to complete it with.
func outcome(claim backend.Record, value string) backend.Record {
	claim.Value = []byte(value)
	return claim
}

// claimAndComplete stores a completed record for key, expiring after ttl.
func claimAndComplete(t *testing.T, b backend.Backend, key, value string, ttl time.Duration) backend.Record {
	t.Helper()
	claim := claimKey(t, b, key, lease)
	require.NoError(t, b.Complete(context.Background(), outcome(claim, value), time.Now(), ttl))
	return claim
}

// get returns key's record, and whether there is one.
func get(t *testing.T, b backend.Backend, key string) (backend.Record, bool) {
	t.Helper()
	rec, ok, err := b.Get(context.Background(), key, time.Now())
	require.NoError(t, err)
	return rec, ok
}

// eventually polls cond until it holds, for at most ten seconds: time for a
// short lease or TTL to run out on any clock.
func eventually(t *testing.T, cond func() bool, msg string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out: %s", msg)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// assertOutcome checks that rec is claim's record completed with value.
func assertOutcome(t *testing.T, claim backend.Record, value string, rec backend.Record) {
	t.Helper()
	assert.Equal(t, claim.Key, rec.Key, "Key")
	assert.Equal(t, claim.Fingerprint, rec.Fingerprint, "Fingerprint")
	assert.Equal(t, claim.Token, rec.Token, "Token")
	assert.Equal(t, backend.StateCompleted, rec.State, "State")
	assert.Equal(t, value, string(rec.Value), "Value")
	assert.False(t, rec.ExpiresAt.IsZero(), "a completed record has an expiry")
	assert.True(t, rec.LeaseUntil.IsZero(), "a completed record has no lease")
}

func testClaimHasOneWinner(t *testing.T, b backend.Backend) {
	const claimers = 100
	start := make(chan struct{})
	type result struct {
		req, got backend.Record
		won      bool
		err      error
	}
	results := make([]result, claimers)
	var wg sync.WaitGroup
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := request("contested")
			<-start
			got, won, err := b.Claim(context.Background(), req, time.Now(), lease)
			results[i] = result{req, got, won, err}
		}()
	}
	close(start)
	wg.Wait()

	var winner *result
	for i := range results {
		r := &results[i]
		require.NoError(t, r.err)
		if r.won {
			require.Nil(t, winner, "two claims of one key both won")
			winner = r
		}
	}
	require.NotNil(t, winner, "no claim won")
	for _, r := range results {
		assert.Equal(t, winner.req.Token, r.got.Token, "every claim must see the winner's record")
	}
}

func testClaimReturnsExisting(t *testing.T, b backend.Backend) {
	ctx := context.Background()
	first := claimKey(t, b, "k", lease)
	assert.False(t, first.CreatedAt.IsZero(), "a claim has a creation time")
	assert.InDelta(t, float64(lease), float64(first.LeaseUntil.Sub(first.CreatedAt)), float64(2*time.Millisecond), "the lease runs from the claim")

	got, won, err := b.Claim(ctx, request("k"), time.Now(), lease)
	require.NoError(t, err)
	assert.False(t, won, "a pending record is never taken over by Claim")
	assert.Equal(t, first.Token, got.Token)
	assert.Equal(t, backend.StatePending, got.State)
	assert.Equal(t, first.Fingerprint, got.Fingerprint)

	require.NoError(t, b.Complete(ctx, outcome(first, "v"), time.Now(), ttl))
	got, won, err = b.Claim(ctx, request("k"), time.Now(), lease)
	require.NoError(t, err)
	assert.False(t, won)
	assertOutcome(t, first, "v", got)
	assert.InDelta(t, float64(ttl), float64(got.ExpiresAt.Sub(first.CreatedAt)), float64(5*time.Second), "the outcome expires a TTL after it was recorded")
}

func testCompleteChecksToken(t *testing.T, b backend.Backend) {
	ctx := context.Background()
	claim := claimKey(t, b, "k", lease)

	stale := outcome(claim, "stale")
	stale.Token = token()
	assert.ErrorIs(t, b.Complete(ctx, stale, time.Now(), ttl), backend.ErrNotOwner)
	got, _ := get(t, b, "k")
	assert.Equal(t, backend.StatePending, got.State, "a refused Complete changed the record")
	assert.Equal(t, claim.Token, got.Token)

	require.NoError(t, b.Complete(ctx, outcome(claim, "v"), time.Now(), ttl))
	assert.ErrorIs(t, b.Complete(ctx, outcome(claim, "overwrite"), time.Now(), ttl), backend.ErrNotOwner, "a completed record is final")
	got, _ = get(t, b, "k")
	assertOutcome(t, claim, "v", got)

	missing := outcome(request("absent"), "v")
	assert.ErrorIs(t, b.Complete(ctx, missing, time.Now(), ttl), backend.ErrNotOwner)
	_, ok := get(t, b, "absent")
	assert.False(t, ok, "Complete of an absent key must not create it")
}

func testReleaseChecksToken(t *testing.T, b backend.Backend) {
	ctx := context.Background()
	claim := claimKey(t, b, "k", lease)
	assert.ErrorIs(t, b.Release(ctx, "k", token()), backend.ErrNotOwner)
	_, ok := get(t, b, "k")
	require.True(t, ok, "a refused release deleted the record")

	require.NoError(t, b.Release(ctx, "k", claim.Token))
	_, ok = get(t, b, "k")
	assert.False(t, ok)
	claimKey(t, b, "k", lease) // a released key can be claimed again

	done := claimAndComplete(t, b, "done", "v", ttl)
	assert.ErrorIs(t, b.Release(ctx, "done", done.Token), backend.ErrNotOwner, "a completed record cannot be released")
	assert.ErrorIs(t, b.Release(ctx, "absent", token()), backend.ErrNotOwner)
}

func testRenewChecksToken(t *testing.T, b backend.Backend) {
	ctx := context.Background()
	claim := claimKey(t, b, "k", lease)
	assert.ErrorIs(t, b.Renew(ctx, "k", token(), time.Now(), 2*lease), backend.ErrNotOwner)
	require.NoError(t, b.Renew(ctx, "k", claim.Token, time.Now(), 2*lease))
	got, _ := get(t, b, "k")
	assert.Equal(t, backend.StatePending, got.State)
	assert.True(t, got.LeaseUntil.After(claim.LeaseUntil.Add(lease/2)), "the lease was extended: was %v, now %v", claim.LeaseUntil, got.LeaseUntil)
	assert.Equal(t, claim.CreatedAt.UnixMilli(), got.CreatedAt.UnixMilli(), "renewal keeps the creation time")

	require.NoError(t, b.Complete(ctx, outcome(claim, "v"), time.Now(), ttl))
	assert.ErrorIs(t, b.Renew(ctx, "k", claim.Token, time.Now(), lease), backend.ErrNotOwner, "a completed record has no lease to renew")
	assert.ErrorIs(t, b.Renew(ctx, "absent", claim.Token, time.Now(), lease), backend.ErrNotOwner)
}

func testRecordsRoundTrip(t *testing.T, b backend.Backend) {
	ctx := context.Background()
	every := make([]byte, 256)
	for i := range every {
		every[i] = byte(i)
	}
	large := []byte(strings.Repeat("0123456789abcdef", 1<<16)) // 1 MiB
	for _, tc := range []struct {
		name   string
		key    string
		value  []byte
		failed bool
		msg    string
	}{
		{"every byte", "every-byte", every, false, ""},
		{"empty value", "empty", []byte{}, false, ""},
		{"large value", "large", large, false, ""},
		{"final error", "declined", []byte(`{"amount":450}`), true, "card declined: insufficient funds ✗"},
		{"unicode key", "clé/€/日本-" + strings.Repeat("k", 200), []byte("v"), false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := request(tc.key)
			req.Fingerprint = idem.Fingerprint{0xff, 0x00, 0x80, 0x7f}
			claim, won, err := b.Claim(ctx, req, time.Now(), lease)
			require.NoError(t, err)
			require.True(t, won)
			done := claim
			done.Value, done.Failed, done.ErrMsg = tc.value, tc.failed, tc.msg
			require.NoError(t, b.Complete(ctx, done, time.Now(), 36*time.Hour))
			got, ok := get(t, b, tc.key)
			require.True(t, ok)
			assert.Equal(t, tc.key, got.Key)
			assert.Equal(t, req.Fingerprint, got.Fingerprint)
			assert.Equal(t, req.Token, got.Token)
			assert.Equal(t, backend.StateCompleted, got.State)
			assert.Equal(t, len(tc.value), len(got.Value), "len(Value)")
			assert.True(t, string(tc.value) == string(got.Value), "Value differs")
			assert.Equal(t, tc.failed, got.Failed, "Failed")
			assert.Equal(t, tc.msg, got.ErrMsg, "ErrMsg")
			assert.Equal(t, claim.CreatedAt.UnixMilli(), got.CreatedAt.UnixMilli(), "CreatedAt is kept")
		})
	}
}

func testManyKeysConcurrently(t *testing.T, b backend.Backend) {
	const workers, keys = 16, 50
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			for k := range keys {
				key := fmt.Sprintf("w%d-k%d", w, k)
				claim, won, err := b.Claim(ctx, request(key), time.Now(), lease)
				if err != nil || !won {
					errs <- fmt.Errorf("claim %s: won=%v err=%v", key, won, err)
					return
				}
				if err := b.Complete(ctx, outcome(claim, key), time.Now(), ttl); err != nil {
					errs <- fmt.Errorf("complete %s: %w", key, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for w := range workers {
		for k := range keys {
			key := fmt.Sprintf("w%d-k%d", w, k)
			got, ok := get(t, b, key)
			require.True(t, ok, key)
			assert.Equal(t, key, string(got.Value))
		}
	}
}
