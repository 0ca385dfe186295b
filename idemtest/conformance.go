// Package idemtest helps test code built on idem: a conformance suite that
// every idem.Backend must pass, an in-memory reference Backend, and a
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
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Run checks that the Backend made by newBackend keeps the contract
// documented on idem.Backend. newBackend is called once per subtest and must
// return an empty backend; register its cleanup with t.Cleanup.
//
// Times are compared to the microsecond, the finest that common databases
// keep.
func Run(t *testing.T, newBackend func(t *testing.T) idem.Backend) {
	for _, tc := range []struct {
		name string
		test func(*testing.T, idem.Backend)
	}{
		{"ClaimHasOneWinner", testClaimHasOneWinner},
		{"ClaimReturnsExisting", testClaimReturnsExisting},
		{"CompleteChecksToken", testCompleteChecksToken},
		{"ReleaseChecksToken", testReleaseChecksToken},
		{"RenewChecksToken", testRenewChecksToken},
		{"CompletedRecordExpires", testCompletedRecordExpires},
		{"SweepSparesClaimOverExpired", testSweepSparesClaimOverExpired},
		{"SweepDeletesExpiredOnly", testSweepDeletesExpiredOnly},
		{"GetAndForget", testGetAndForget},
		{"RecordsRoundTrip", testRecordsRoundTrip},
		{"ManyKeysConcurrently", testManyKeysConcurrently},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.test(t, newBackend(t)) })
	}
}

// epoch is the suite's "now": the time the suite started, so that backends
// that also expire records by the real clock (Redis TTLs) see the suite's
// times as future ones, to the millisecond, the precision of Redis TTLs.
var epoch = time.Now().UTC().Truncate(time.Millisecond)

func token() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// pending returns a fresh claim of key.
func pending(key string) idem.Record {
	return idem.Record{
		Key:         key,
		Fingerprint: idem.Fingerprint{1, 2, 3, byte(len(key))},
		Token:       token(),
		State:       idem.StatePending,
		CreatedAt:   epoch,
		LeaseUntil:  epoch.Add(time.Minute),
	}
}

// completed returns claim's record completed with value, expiring after ttl.
func completed(claim idem.Record, value string, ttl time.Duration) idem.Record {
	claim.State = idem.StateCompleted
	claim.LeaseUntil = time.Time{}
	claim.ExpiresAt = claim.CreatedAt.Add(ttl)
	claim.Value = []byte(value)
	return claim
}

// claimAndComplete stores a completed record for key.
func claimAndComplete(t *testing.T, b idem.Backend, key, value string, ttl time.Duration) idem.Record {
	t.Helper()
	ctx := context.Background()
	claim := pending(key)
	_, ok, err := b.Claim(ctx, claim, epoch)
	require.NoError(t, err)
	require.True(t, ok, "claim of a new key %q", key)
	done := completed(claim, value, ttl)
	require.NoError(t, b.Complete(ctx, done))
	return done
}

// assertSameRecord checks two records field by field, times to the
// microsecond.
func assertSameRecord(t *testing.T, want, got idem.Record) {
	t.Helper()
	assert.Equal(t, want.Key, got.Key, "Key")
	assert.Equal(t, want.Fingerprint, got.Fingerprint, "Fingerprint")
	assert.Equal(t, want.Token, got.Token, "Token")
	assert.Equal(t, want.State, got.State, "State")
	assert.True(t, want.CreatedAt.Truncate(time.Microsecond).Equal(got.CreatedAt), "CreatedAt: want %v, got %v", want.CreatedAt, got.CreatedAt)
	assert.True(t, want.ExpiresAt.Truncate(time.Microsecond).Equal(got.ExpiresAt), "ExpiresAt: want %v, got %v", want.ExpiresAt, got.ExpiresAt)
	assert.True(t, want.LeaseUntil.Truncate(time.Microsecond).Equal(got.LeaseUntil), "LeaseUntil: want %v, got %v", want.LeaseUntil, got.LeaseUntil)
	assert.Equal(t, len(want.Value), len(got.Value), "len(Value)")
	assert.True(t, string(want.Value) == string(got.Value), "Value differs")
	assert.Equal(t, want.Failed, got.Failed, "Failed")
	assert.Equal(t, want.ErrMsg, got.ErrMsg, "ErrMsg")
}

func testClaimHasOneWinner(t *testing.T, b idem.Backend) {
	const claimers = 100
	start := make(chan struct{})
	type result struct {
		claim idem.Record
		got   idem.Record
		won   bool
		err   error
	}
	results := make([]result, claimers)
	var wg sync.WaitGroup
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			claim := pending("contested")
			<-start
			got, won, err := b.Claim(context.Background(), claim, epoch)
			results[i] = result{claim, got, won, err}
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
		assert.Equal(t, winner.claim.Token, r.got.Token, "every claim must see the winner's record")
	}
}

func testClaimReturnsExisting(t *testing.T, b idem.Backend) {
	ctx := context.Background()
	first := pending("k")
	_, won, err := b.Claim(ctx, first, epoch)
	require.NoError(t, err)
	require.True(t, won)
	got, won, err := b.Claim(ctx, pending("k"), epoch.Add(time.Hour))
	require.NoError(t, err)
	assert.False(t, won, "a pending record is never taken over by Claim")
	assertSameRecord(t, first, got)

	done := completed(first, "v", time.Hour)
	require.NoError(t, b.Complete(ctx, done))
	got, won, err = b.Claim(ctx, pending("k"), epoch.Add(time.Minute))
	require.NoError(t, err)
	assert.False(t, won)
	assertSameRecord(t, done, got)
}

func testCompleteChecksToken(t *testing.T, b idem.Backend) {
	ctx := context.Background()
	claim := pending("k")
	_, _, err := b.Claim(ctx, claim, epoch)
	require.NoError(t, err)

	stale := completed(claim, "stale", time.Hour)
	stale.Token = token()
	assert.ErrorIs(t, b.Complete(ctx, stale), idem.ErrNotOwner)
	got, _, err := b.Get(ctx, "k")
	require.NoError(t, err)
	assertSameRecord(t, claim, got)

	done := completed(claim, "v", time.Hour)
	require.NoError(t, b.Complete(ctx, done))
	again := completed(claim, "overwrite", time.Hour)
	assert.ErrorIs(t, b.Complete(ctx, again), idem.ErrNotOwner, "a completed record is final")
	got, _, err = b.Get(ctx, "k")
	require.NoError(t, err)
	assertSameRecord(t, done, got)

	missing := completed(pending("absent"), "v", time.Hour)
	assert.ErrorIs(t, b.Complete(ctx, missing), idem.ErrNotOwner)
	_, ok, err := b.Get(ctx, "absent")
	require.NoError(t, err)
	assert.False(t, ok, "Complete of an absent key must not create it")
}

func testReleaseChecksToken(t *testing.T, b idem.Backend) {
	ctx := context.Background()
	claim := pending("k")
	_, _, err := b.Claim(ctx, claim, epoch)
	require.NoError(t, err)
	assert.ErrorIs(t, b.Release(ctx, "k", token()), idem.ErrNotOwner)
	_, ok, err := b.Get(ctx, "k")
	require.NoError(t, err)
	require.True(t, ok, "a refused release deleted the record")

	require.NoError(t, b.Release(ctx, "k", claim.Token))
	_, ok, err = b.Get(ctx, "k")
	require.NoError(t, err)
	assert.False(t, ok)
	_, won, err := b.Claim(ctx, pending("k"), epoch)
	require.NoError(t, err)
	assert.True(t, won, "a released key can be claimed again")

	done := claimAndComplete(t, b, "done", "v", time.Hour)
	assert.ErrorIs(t, b.Release(ctx, "done", done.Token), idem.ErrNotOwner, "a completed record cannot be released")
	assert.ErrorIs(t, b.Release(ctx, "absent", token()), idem.ErrNotOwner)
}

func testRenewChecksToken(t *testing.T, b idem.Backend) {
	ctx := context.Background()
	claim := pending("k")
	_, _, err := b.Claim(ctx, claim, epoch)
	require.NoError(t, err)
	later := epoch.Add(time.Hour)
	assert.ErrorIs(t, b.Renew(ctx, "k", token(), epoch, later), idem.ErrNotOwner)
	assert.ErrorIs(t, b.Renew(ctx, "k", claim.Token, epoch.Add(2*time.Minute), later), idem.ErrNotOwner, "a lapsed lease must not come back to life")
	require.NoError(t, b.Renew(ctx, "k", claim.Token, epoch, later))
	got, _, err := b.Get(ctx, "k")
	require.NoError(t, err)
	claim.LeaseUntil = later
	assertSameRecord(t, claim, got)

	done := completed(claim, "v", time.Hour)
	require.NoError(t, b.Complete(ctx, done))
	assert.ErrorIs(t, b.Renew(ctx, "k", claim.Token, epoch, later), idem.ErrNotOwner, "a completed record has no lease to renew")
	assert.ErrorIs(t, b.Renew(ctx, "absent", claim.Token, epoch, later), idem.ErrNotOwner)
}

func testCompletedRecordExpires(t *testing.T, b idem.Backend) {
	ctx := context.Background()
	claimAndComplete(t, b, "k", "v", time.Hour)
	_, won, err := b.Claim(ctx, pending("k"), epoch.Add(time.Hour-time.Microsecond))
	require.NoError(t, err)
	assert.False(t, won, "claimed before expiry")

	fresh := pending("k")
	got, won, err := b.Claim(ctx, fresh, epoch.Add(time.Hour))
	require.NoError(t, err)
	assert.True(t, won, "an expired record must give way to a new claim")
	assertSameRecord(t, fresh, got)
}

// A claim that took over an expired record must not be swept with the old
// record's expiry.
func testSweepSparesClaimOverExpired(t *testing.T, b idem.Backend) {
	ctx := context.Background()
	claimAndComplete(t, b, "k", "old", time.Minute)
	fresh := pending("k")
	_, won, err := b.Claim(ctx, fresh, epoch.Add(time.Hour))
	require.NoError(t, err)
	require.True(t, won)
	_, err = b.Sweep(ctx, epoch.Add(1000*time.Hour), 100)
	require.NoError(t, err)
	got, ok, err := b.Get(ctx, "k")
	require.NoError(t, err)
	require.True(t, ok, "the new claim was swept away")
	assertSameRecord(t, fresh, got)
}

func testSweepDeletesExpiredOnly(t *testing.T, b idem.Backend) {
	ctx := context.Background()
	for i := range 10 {
		claimAndComplete(t, b, fmt.Sprint("short-", i), "v", time.Duration(i+1)*time.Minute)
	}
	claimAndComplete(t, b, "long", "v", 24*time.Hour)
	_, _, err := b.Claim(ctx, pending("pending"), epoch)
	require.NoError(t, err)

	n, err := b.Sweep(ctx, epoch.Add(30*time.Second), 100)
	require.NoError(t, err)
	assert.Equal(t, 0, n, "nothing had expired")

	n, err = b.Sweep(ctx, epoch.Add(time.Hour), 4)
	require.NoError(t, err)
	assert.Equal(t, 4, n, "Sweep must respect its limit")
	for i := range 10 {
		_, ok, err := b.Get(ctx, fmt.Sprint("short-", i))
		require.NoError(t, err)
		assert.Equal(t, i >= 4, ok, "short-%d: the oldest expiry goes first", i)
	}
	n, err = b.Sweep(ctx, epoch.Add(time.Hour), 100)
	require.NoError(t, err)
	assert.Equal(t, 6, n)
	for _, key := range []string{"long", "pending"} {
		_, ok, err := b.Get(ctx, key)
		require.NoError(t, err)
		assert.True(t, ok, "%s must not be swept", key)
	}
	n, err = b.Sweep(ctx, epoch.Add(1000*time.Hour), 100)
	require.NoError(t, err)
	assert.Equal(t, 1, n, "only the long-lived record expires; a pending one never does")
}

func testGetAndForget(t *testing.T, b idem.Backend) {
	ctx := context.Background()
	_, ok, err := b.Get(ctx, "absent")
	require.NoError(t, err)
	assert.False(t, ok)
	assert.NoError(t, b.Forget(ctx, "absent", epoch))

	done := claimAndComplete(t, b, "done", "v", time.Hour)
	got, ok, err := b.Get(ctx, "done")
	require.NoError(t, err)
	require.True(t, ok)
	assertSameRecord(t, done, got)
	require.NoError(t, b.Forget(ctx, "done", epoch))
	_, ok, err = b.Get(ctx, "done")
	require.NoError(t, err)
	assert.False(t, ok)
	_, won, err := b.Claim(ctx, pending("done"), epoch)
	require.NoError(t, err)
	assert.True(t, won, "a forgotten key can be claimed again")

	_, _, err = b.Claim(ctx, pending("busy"), epoch)
	require.NoError(t, err)
	assert.ErrorIs(t, b.Forget(ctx, "busy", epoch), idem.ErrInProgress, "a pending record cannot be forgotten")
	_, ok, err = b.Get(ctx, "busy")
	require.NoError(t, err)
	assert.True(t, ok)
	require.NoError(t, b.Forget(ctx, "busy", epoch.Add(time.Hour)), "a claim whose lease lapsed can be forgotten")
	_, ok, err = b.Get(ctx, "busy")
	require.NoError(t, err)
	assert.False(t, ok)
}

func testRecordsRoundTrip(t *testing.T, b idem.Backend) {
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
			claim := pending(tc.key)
			claim.Fingerprint = idem.Fingerprint{0xff, 0x00, 0x80, 0x7f}
			_, won, err := b.Claim(ctx, claim, epoch)
			require.NoError(t, err)
			require.True(t, won)
			done := completed(claim, "", 36*time.Hour)
			done.Value, done.Failed, done.ErrMsg = tc.value, tc.failed, tc.msg
			require.NoError(t, b.Complete(ctx, done))
			got, ok, err := b.Get(ctx, tc.key)
			require.NoError(t, err)
			require.True(t, ok)
			assertSameRecord(t, done, got)
		})
	}
}

func testManyKeysConcurrently(t *testing.T, b idem.Backend) {
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
				claim := pending(key)
				if _, won, err := b.Claim(ctx, claim, epoch); err != nil || !won {
					errs <- fmt.Errorf("claim %s: won=%v err=%v", key, won, err)
					return
				}
				if err := b.Complete(ctx, completed(claim, key, time.Hour)); err != nil {
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
			got, ok, err := b.Get(context.Background(), key)
			require.NoError(t, err)
			require.True(t, ok, key)
			assert.Equal(t, key, string(got.Value))
		}
	}
}
