package idemtest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// RunSteps checks that the Stepper made by newBackend keeps the contract
// documented on backend.Stepper: steps are recorded only under the claim
// that holds the key, survive as bytes, and an interrupted claim is taken
// over, its steps kept, by exactly one Resume. Run it besides Run.
func RunSteps(t *testing.T, newBackend func(t *testing.T) backend.Stepper) {
	for _, tc := range []struct {
		name string
		test func(*testing.T, backend.Stepper)
	}{
		{"StepsRoundTrip", testStepsRoundTrip},
		{"RecordStepChecksToken", testRecordStepChecksToken},
		{"ResumeKeepsSteps", testResumeKeepsSteps},
		{"ResumeHasOneWinner", testResumeHasOneWinner},
		{"ResumeOnlyInterrupted", testResumeOnlyInterrupted},
		{"ResumedClaimHoldsItsLease", testResumedClaimHoldsItsLease},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.test(t, newBackend(t)) })
	}
}

func testStepsRoundTrip(t *testing.T, b backend.Stepper) {
	ctx := context.Background()
	claim := claimKey(t, b, "k", lease)
	steps := []backend.Step{
		{Name: "create-order", Value: []byte(`{"id":7}`)},
		{Name: "charge", Value: []byte{0, 1, 254, 255}, Failed: true, ErrMsg: "card declined"},
	}
	before := time.Now()
	for _, s := range steps {
		require.NoError(t, b.RecordStep(ctx, "k", claim.Token, s, time.Now()))
	}
	// The same name again replaces the step: a step that ran again after
	// its record was lost is recorded once.
	steps[0].Value = []byte(`{"id":8}`)
	require.NoError(t, b.RecordStep(ctx, "k", claim.Token, steps[0], time.Now()))

	rec, ok := get(t, b, "k")
	require.True(t, ok)
	require.Len(t, rec.Steps, 2)
	byName := map[string]backend.Step{}
	for _, s := range rec.Steps {
		byName[s.Name] = s
	}
	for _, want := range steps {
		got := byName[want.Name]
		assert.Equal(t, want.Value, got.Value, "%s: value byte for byte", want.Name)
		assert.Equal(t, want.Failed, got.Failed, want.Name)
		assert.Equal(t, want.ErrMsg, got.ErrMsg, want.Name)
		assert.False(t, got.At.Before(before.Add(-time.Minute)), "%s: recorded at %v", want.Name, got.At)
	}
	// Completing the operation keeps its steps, for the operator's eyes,
	// and its fingerprint, whatever the outcome's record holds.
	done := outcome(claim, "done")
	done.Fingerprint = idem.Fingerprint{0xde, 0xad}
	require.NoError(t, b.Complete(ctx, done, time.Now(), ttl))
	rec, _ = get(t, b, "k")
	assert.Len(t, rec.Steps, 2)
	assert.Equal(t, claim.Fingerprint, rec.Fingerprint, "Complete kept the claim's fingerprint")
}

func testRecordStepChecksToken(t *testing.T, b backend.Stepper) {
	ctx := context.Background()
	claim := claimKey(t, b, "k", lease)
	step := backend.Step{Name: "s", Value: []byte("v")}
	assert.ErrorIs(t, b.RecordStep(ctx, "k", "another token", step, time.Now()), backend.ErrNotOwner)
	assert.ErrorIs(t, b.RecordStep(ctx, "absent", claim.Token, step, time.Now()), backend.ErrNotOwner)
	done := claimAndComplete(t, b, "done", "v", ttl)
	assert.ErrorIs(t, b.RecordStep(ctx, "done", done.Token, step, time.Now()), backend.ErrNotOwner, "a completed record takes no step")

	short := claimKey(t, b, "short", shortLease)
	eventually(t, func() bool { rec, _ := get(t, b, "short"); return rec.State == backend.StateInterrupted }, "the short lease lapses")
	assert.ErrorIs(t, b.RecordStep(ctx, "short", short.Token, step, time.Now()), backend.ErrNotOwner, "a claim whose lease lapsed takes no step")
	rec, _ := get(t, b, "k")
	assert.Empty(t, rec.Steps)
}

// interruptedWithSteps claims key, records steps, then shortens the lease
// and waits until it lapses. The lease is shortened only after the steps
// are in, so a slow disk cannot make it lapse before them.
func interruptedWithSteps(t *testing.T, b backend.Stepper, key string, names ...string) backend.Record {
	ctx := context.Background()
	claim := claimKey(t, b, key, lease)
	for _, n := range names {
		require.NoError(t, b.RecordStep(ctx, key, claim.Token, backend.Step{Name: n, Value: []byte(n)}, time.Now()))
	}
	require.NoError(t, b.Renew(ctx, key, claim.Token, time.Now(), shortLease))
	eventually(t, func() bool { rec, _ := get(t, b, key); return rec.State == backend.StateInterrupted }, "the short lease lapses")
	return claim
}

func testResumeKeepsSteps(t *testing.T, b backend.Stepper) {
	ctx := context.Background()
	dead := interruptedWithSteps(t, b, "k", "one", "two")
	next := token()
	rec, err := b.Resume(ctx, "k", dead.Token, next, time.Now(), lease)
	require.NoError(t, err)
	assert.Equal(t, next, rec.Token)
	assert.Equal(t, backend.StatePending, rec.State)
	assert.Equal(t, dead.Fingerprint, rec.Fingerprint, "the fingerprint stays: the same operation")
	require.Len(t, rec.Steps, 2)
	assert.Equal(t, "one", string(rec.Steps[0].Value))

	got, _ := get(t, b, "k")
	assert.Equal(t, backend.StatePending, got.State, "its new lease holds")
	assert.ErrorIs(t, b.RecordStep(ctx, "k", dead.Token, backend.Step{Name: "three"}, time.Now()), backend.ErrNotOwner,
		"the stale owner cannot record a step once another took over")
	require.NoError(t, b.RecordStep(ctx, "k", next, backend.Step{Name: "three", Value: []byte("3")}, time.Now()))
	require.NoError(t, b.Complete(ctx, outcome(rec, "done"), time.Now(), ttl))
	got, _ = get(t, b, "k")
	assertOutcome(t, rec, "done", got)
	assert.Len(t, got.Steps, 3)
}

func testResumeHasOneWinner(t *testing.T, b backend.Stepper) {
	dead := interruptedWithSteps(t, b, "k", "one")
	const resumers = 20
	var wg sync.WaitGroup
	start := make(chan struct{})
	wins := make(chan string, resumers)
	for range resumers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			tok := token()
			if _, err := b.Resume(context.Background(), "k", dead.Token, tok, time.Now(), lease); err == nil {
				wins <- tok
			} else if !errors.Is(err, backend.ErrNotOwner) {
				t.Errorf("Resume: %v", err)
			}
		}()
	}
	close(start)
	wg.Wait()
	close(wins)
	var winners []string
	for w := range wins {
		winners = append(winners, w)
	}
	require.Len(t, winners, 1, "exactly one Resume takes the record over")
	rec, _ := get(t, b, "k")
	assert.Equal(t, winners[0], rec.Token)
}

func testResumeOnlyInterrupted(t *testing.T, b backend.Stepper) {
	ctx := context.Background()
	live := claimKey(t, b, "live", lease)
	_, err := b.Resume(ctx, "live", live.Token, token(), time.Now(), lease)
	assert.ErrorIs(t, err, backend.ErrNotOwner, "a claim whose lease holds is not taken over")
	done := claimAndComplete(t, b, "done", "v", ttl)
	_, err = b.Resume(ctx, "done", done.Token, token(), time.Now(), lease)
	assert.ErrorIs(t, err, backend.ErrNotOwner, "nor a completed record")
	_, err = b.Resume(ctx, "absent", "t", token(), time.Now(), lease)
	assert.ErrorIs(t, err, backend.ErrNotOwner, "nor a key without a record")
	interruptedWithSteps(t, b, "dead")
	_, err = b.Resume(ctx, "dead", "another token", token(), time.Now(), lease)
	assert.ErrorIs(t, err, backend.ErrNotOwner, "nor a record under another token")
}

// A resumed claim holds the lease Resume was given, and lapses when it is
// not renewed, as a claim does: one that held none would leave the key of
// a resumer that died pending for good, which Forget refuses.
func testResumedClaimHoldsItsLease(t *testing.T, b backend.Stepper) {
	ctx := context.Background()
	dead := interruptedWithSteps(t, b, "k", "one")
	rec, err := b.Resume(ctx, "k", dead.Token, token(), time.Now(), shortLease)
	require.NoError(t, err)
	assert.False(t, rec.LeaseUntil.IsZero(), "the resumed claim has a lease")
	eventually(t, func() bool { got, _ := get(t, b, "k"); return got.State == backend.StateInterrupted },
		"the resumed claim's lease lapses when it is not renewed")
	require.NoError(t, b.Forget(ctx, "k", time.Now()), "a resumed claim whose lease lapsed can be forgotten")
}
