package idemtest

import (
	"context"
	"testing"
	"time"

	"github.com/seed094d4201/idem/backend"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// testEachReturnsEveryField: Each hands fn every field that Claim,
// Complete and RecordStep wrote, for completed, pending and interrupted
// records alike: an operator's tool and Store.Records read only Each, so
// a listing that dropped a record's outcome or its steps would show an
// operation as having produced nothing. Each checks against what was
// written (Value, Failed, ErrMsg, the steps' outcomes) and against Get
// (the instants, which are the backend's): both read one stored record.
func testEachReturnsEveryField(t *testing.T, b backend.Backend) {
	lister, ok := b.(backend.Lister)
	if !ok {
		t.Skip("the backend cannot list its records")
	}
	stepper, _ := b.(backend.Stepper)
	ctx := context.Background()
	every := make([]byte, 256)
	for i := range every {
		every[i] = byte(i)
	}
	steps := []backend.Step{
		{Name: "create-order", Value: []byte(`{"id":7}`)},
		{Name: "charge", Value: []byte{0, 1, 254, 255}, Failed: true, ErrMsg: "card declined ✗"},
	}
	// written is what the test stored under each key.
	written := map[string]backend.Record{}
	record := func(key string, claim backend.Record, steps []backend.Step) backend.Record {
		for _, s := range steps {
			require.NoError(t, stepper.RecordStep(ctx, key, claim.Token, s, time.Now()), "RecordStep %s", s.Name)
		}
		claim.Steps = steps
		return claim
	}
	complete := func(key string, value []byte, failed bool, msg string, steps []backend.Step) {
		claim := claimKey(t, b, key, lease)
		if steps != nil {
			claim = record(key, claim, steps)
		}
		claim.Value, claim.Failed, claim.ErrMsg = value, failed, msg
		require.NoError(t, b.Complete(ctx, claim, time.Now(), ttl))
		claim.State = backend.StateCompleted
		written[key] = claim
	}
	complete("done", every, false, "", nil)
	complete("declined", []byte(`{"amount":450}`), true, "card declined: insufficient funds ✗", nil)
	written["pending"] = claimKey(t, b, "pending", lease)
	// An interrupted record: its lease is shortened only once its steps
	// are in, so that a slow disk cannot make it lapse before them.
	interrupted := claimKey(t, b, "interrupted", lease)
	if stepper != nil {
		complete("done-steps", []byte("done"), false, "", steps)
		written["pending-steps"] = record("pending-steps", claimKey(t, b, "pending-steps", lease), steps)
		interrupted = record("interrupted", interrupted, steps)
	}
	require.NoError(t, b.Renew(ctx, "interrupted", interrupted.Token, time.Now(), shortLease))
	written["interrupted"] = interrupted
	eventually(t, func() bool { rec, _ := get(t, b, "interrupted"); return rec.State == backend.StateInterrupted },
		"the short lease lapses")

	listed := map[string]backend.Record{}
	require.NoError(t, lister.Each(ctx, func(rec backend.Record) error {
		listed[rec.Key] = rec
		return nil
	}))
	for key, want := range written {
		t.Run(key, func(t *testing.T) {
			got, ok := listed[key]
			require.True(t, ok, "Each did not list %q", key)
			stored, ok := get(t, b, key)
			require.True(t, ok, "Get(%q)", key)
			assertListed(t, want, stored, got)
		})
	}
}

// assertListed checks that got, what Each listed, holds every field of
// want, what was written, and the instants of stored, what Get returned.
func assertListed(t *testing.T, want, stored, got backend.Record) {
	t.Helper()
	assert.Equal(t, want.Key, got.Key, "Key")
	assert.Equal(t, want.Fingerprint, got.Fingerprint, "Fingerprint")
	assert.Equal(t, want.Token, got.Token, "Token")
	// Each lists records as stored: a claim whose lease lapsed may come
	// pending, as stored, or interrupted, as Get reports it.
	if stored.State == backend.StateInterrupted && got.State == backend.StatePending {
		assert.False(t, got.LeaseUntil.IsZero(), "a lapsed claim listed pending with no lease reads as one that never lapses")
	} else {
		assert.Equal(t, stored.State, got.State, "State")
	}
	assertSameInstant(t, stored.CreatedAt, got.CreatedAt, "CreatedAt")
	assertSameInstant(t, stored.ExpiresAt, got.ExpiresAt, "ExpiresAt")
	assertSameInstant(t, stored.LeaseUntil, got.LeaseUntil, "LeaseUntil")
	if want.State == backend.StateCompleted {
		assert.False(t, got.ExpiresAt.IsZero(), "a completed record is listed with its expiry")
		assert.InDelta(t, float64(ttl), float64(got.ExpiresAt.Sub(got.CreatedAt)), float64(time.Minute), "the listed expiry is the TTL's")
	} else {
		assert.False(t, got.LeaseUntil.IsZero(), "a claim is listed with its lease")
	}
	assert.Equal(t, len(want.Value), len(got.Value), "len(Value)")
	assert.True(t, string(want.Value) == string(got.Value), "Value differs: wrote %q, listed %q", want.Value, got.Value)
	assert.Equal(t, want.Failed, got.Failed, "Failed")
	assert.Equal(t, want.ErrMsg, got.ErrMsg, "ErrMsg")
	if !assert.Len(t, got.Steps, len(want.Steps), "Steps") {
		return
	}
	for i, w := range want.Steps {
		g := got.Steps[i]
		assert.Equal(t, w.Name, g.Name, "step %d: Name", i)
		assert.True(t, string(w.Value) == string(g.Value), "step %s: Value differs: wrote %q, listed %q", w.Name, w.Value, g.Value)
		assert.Equal(t, w.Failed, g.Failed, "step %s: Failed", w.Name)
		assert.Equal(t, w.ErrMsg, g.ErrMsg, "step %s: ErrMsg", w.Name)
		assert.False(t, g.At.IsZero(), "step %s: listed with no time", w.Name)
		if i < len(stored.Steps) {
			assertSameInstant(t, stored.Steps[i].At, g.At, "step "+w.Name+": At")
		}
	}
}

// assertSameInstant checks that Each and Get report one stored instant
// alike (both zero, or equal).
func assertSameInstant(t *testing.T, stored, listed time.Time, field string) {
	t.Helper()
	if stored.IsZero() || listed.IsZero() {
		assert.Equal(t, stored.IsZero(), listed.IsZero(), "%s: Get says %v, Each %v", field, stored, listed)
		return
	}
	assert.True(t, stored.Equal(listed), "%s: Get says %v, Each %v", field, stored, listed)
}
