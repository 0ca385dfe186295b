package backend

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// ruleNow is the instant the rules judge the records at.
var ruleNow = time.Unix(1764493200, 0)

// ruleRecords are a key's records in each state the rules tell apart, as
// of ruleNow, each under the token "mine".
func ruleRecords() map[string]Record {
	at := func(d time.Duration) time.Time { return ruleNow.Add(d) }
	return map[string]Record{
		"absent":            {},
		"pending live":      {Token: "mine", State: StatePending, LeaseUntil: at(time.Minute)},
		"pending no lease":  {Token: "mine", State: StatePending},
		"pending lapsed":    {Token: "mine", State: StatePending, LeaseUntil: at(-time.Nanosecond)},
		"pending lapsing":   {Token: "mine", State: StatePending, LeaseUntil: ruleNow}, // lapses at its instant
		"interrupted":       {Token: "mine", State: StateInterrupted},
		"completed live":    {Token: "mine", State: StateCompleted, ExpiresAt: at(time.Hour)},
		"completed expired": {Token: "mine", State: StateCompleted, ExpiresAt: ruleNow},
	}
}

// checkRule asserts that rule holds, under the record's own token, for
// exactly the records named in holds, and never under another token.
func checkRule(t *testing.T, rule func(Record, string) bool, holds ...string) {
	t.Helper()
	want := map[string]bool{}
	for _, name := range holds {
		want[name] = true
	}
	for name, rec := range ruleRecords() {
		assert.Equal(t, want[name], rule(rec, "mine"), "%s, its own token", name)
		if rec.Token != "" {
			assert.False(t, rule(rec, "theirs"), "%s, another token", name)
		}
	}
}

func TestSettleableIsAnUnsettledClaimUnderItsToken(t *testing.T) {
	checkRule(t, Record.Settleable,
		"pending live", "pending no lease", "pending lapsed", "pending lapsing", "interrupted")
}

func TestClaimedByIsPendingUnderItsTokenLapsedOrNot(t *testing.T) {
	checkRule(t, Record.ClaimedBy,
		"pending live", "pending no lease", "pending lapsed", "pending lapsing")
}

func TestHeldByIsPendingUnderItsTokenWithItsLeaseHolding(t *testing.T) {
	checkRule(t, func(r Record, token string) bool { return r.HeldBy(token, ruleNow) },
		"pending live", "pending no lease")
}

func TestLiveIsPendingWithItsLeaseHolding(t *testing.T) {
	checkRule(t, func(r Record, token string) bool { return r.Token == token && r.Live(ruleNow) },
		"pending live", "pending no lease")
}

func TestCompletedByIsCompletedUnderItsToken(t *testing.T) {
	// Expiry is no part of it: a writer reading back its own commit asks
	// whether its outcome landed, which a Get of an expired one answers.
	checkRule(t, Record.CompletedBy, "completed live", "completed expired")
}

func TestResumableIsInterruptedOrLapsedUnderItsToken(t *testing.T) {
	checkRule(t, func(r Record, token string) bool { return r.Resumable(token, ruleNow) },
		"pending lapsed", "pending lapsing", "interrupted")
}

func TestSeenAtInterruptsALapsedClaimAndHidesAnExpiredOutcome(t *testing.T) {
	for name, rec := range ruleRecords() {
		seen, ok := rec.SeenAt(ruleNow)
		switch name {
		case "completed expired":
			assert.False(t, ok, name)
		case "pending lapsed", "pending lapsing":
			assert.True(t, ok, name)
			assert.Equal(t, StateInterrupted, seen.State, name)
			assert.Equal(t, rec.LeaseUntil, seen.LeaseUntil, "%s: a lapse keeps its lease, no proof of death", name)
		default:
			assert.True(t, ok, name)
			assert.Equal(t, rec, seen, name)
		}
	}
}

func TestWithOwnerDeadInterruptsAPendingClaimWithNoLease(t *testing.T) {
	for name, rec := range ruleRecords() {
		dead := rec.WithOwnerDead()
		if rec.State != StatePending {
			assert.Equal(t, rec, dead, name)
			continue
		}
		assert.Equal(t, StateInterrupted, dead.State, name)
		assert.True(t, dead.LeaseUntil.IsZero(), "%s: proven dead, no lease left to judge", name)
		assert.Equal(t, rec.Token, dead.Token, name)
	}
}
