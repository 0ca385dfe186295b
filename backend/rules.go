package backend

import "time"

// The rules every Backend applies to a key's record before it writes,
// written once here so that each backend calls them rather than spelling
// them out: which token may settle a claim, which may renew it or add to
// it, and when a record reads as interrupted or gone. A backend that
// decides in its server (SQL, a Lua script) states the same rules there;
// the conformance suite holds both to them.

// Settleable reports whether Complete or Release may settle r under token:
// r is an unsettled claim (pending, its lease lapsed or not, or
// interrupted) and token is its token. A completed record is final, and a
// claim under another token belongs to a newer owner.
func (r Record) Settleable(token string) bool {
	return r.Token == token && (r.State == StatePending || r.State == StateInterrupted)
}

// ClaimedBy reports whether r is a pending claim held by token, its lease
// lapsed or not: Renew extends it (a lease judged lapsed by a clock that
// stepped forward is still its live owner's), and a Claim that finds it
// has found its own earlier attempt, whose reply was lost.
func (r Record) ClaimedBy(token string) bool {
	return r.Token == token && r.State == StatePending
}

// HeldBy reports whether token still holds r at now: r is pending under
// token and its lease has not lapsed. Only such an owner may add to its
// claim (RecordStep): one whose lease lapsed may have been taken over.
func (r Record) HeldBy(token string, now time.Time) bool {
	return r.Token == token && r.Live(now)
}

// Live reports whether r is a pending claim whose lease holds at now (or
// that has no lease): its owner may still record an outcome, so Forget
// refuses it with ErrInProgress.
func (r Record) Live(now time.Time) bool {
	return r.State == StatePending && !r.Lapsed(now)
}

// CompletedBy reports whether r holds the outcome recorded under token:
// what a writer whose commit's fate is unknown reads back to learn that
// its outcome landed.
func (r Record) CompletedBy(token string) bool {
	return r.Token == token && r.State == StateCompleted
}

// Resumable reports whether Resume may take r over at now from a claim
// holding old: r is interrupted (its owner died, or its lease lapsed) and
// old is its token.
func (r Record) Resumable(old string, now time.Time) bool {
	return r.Token == old && (r.State == StateInterrupted || r.Lapsed(now))
}

// Lapsed reports whether r is a pending record whose lease ran out at now:
// its owner stopped renewing it, so it is as good as interrupted.
func (r Record) Lapsed(now time.Time) bool {
	return r.State == StatePending && !r.LeaseUntil.IsZero() && !now.Before(r.LeaseUntil)
}

// Expired reports whether r is a completed record whose outcome has expired
// at now; a claim may then take its key over.
func (r Record) Expired(now time.Time) bool {
	return r.State == StateCompleted && !now.Before(r.ExpiresAt)
}

// SeenAt returns r as a backend that judges time by now reports it: a
// pending record whose lease has lapsed is interrupted, and a completed
// record that has expired is gone (false).
func (r Record) SeenAt(now time.Time) (Record, bool) {
	switch {
	case r.Expired(now):
		return Record{}, false
	case r.Lapsed(now):
		r.State = StateInterrupted
	}
	return r, true
}

// WithOwnerDead returns r as it stands once its owner is proven dead (it
// held a lock that is now free, as bolt's file lock at Open): a pending
// record becomes interrupted with a zero LeaseUntil, so that no lease is
// left to judge and a Store acts on it at once. Other records come back
// unchanged.
func (r Record) WithOwnerDead() Record {
	if r.State == StatePending {
		r.State, r.LeaseUntil = StateInterrupted, time.Time{}
	}
	return r
}
