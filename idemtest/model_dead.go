package idemtest

import (
	"context"
	"errors"
	"time"

	"github.com/seed094d4201/idem/backend"
)

// A claim that no owner renews any more: its store was killed, or closed,
// with the claim standing (its release refused, or never sent). Its key is
// held until a store judges the owner dead, on evidence no clock step can
// fake (owner.go): the claim seen unrenewed for a whole lease, or for the
// lease the record shows if longer, on that store's monotonic clock,
// within one call. A caller whose ctx ends sooner is answered
// ErrInProgress, as documented for a key another process holds, however
// long ago the owner died; a patient caller (quiesce's probe) judges it.
// The model held such a key only for a while after the death (settled()),
// and judged a short call that came later "ErrInProgress, but nothing held
// the key" (CI, bolt's TestModel, seed 2535708316231076497, under load:
// the holds are on the real clock, so a slow machine outlives them).

// A sighting is the record of its key a call read from the backend, and
// when it first read it as it stands.
type sighting struct {
	rec   backend.Record
	first time.Time
}

// see notes rec, read from the backend under ctx, on the call ctx
// carries, if any. A record that changed (renewed, lapsed, another
// claim's) starts a new sighting, as it restarts the store's watch.
func see(ctx context.Context, rec backend.Record) {
	c, ok := ctx.Value(callKey{}).(*modelCall)
	if !ok {
		return
	}
	c.sightMu.Lock()
	defer c.sightMu.Unlock()
	if s := c.sight; s == nil || !sameClaim(s.rec, rec) {
		c.sight = &sighting{rec: rec, first: time.Now()}
	}
}

// sameClaim reports whether b is a as far as its owner's renewals go.
func sameClaim(a, b backend.Record) bool {
	return a.Key == b.Key && a.Token == b.Token && a.State == b.State && a.LeaseUntil.Equal(b.LeaseUntil)
}

// heldByDead reports whether c, answered ErrInProgress as its ctx ended,
// was waiting on a claim of a dead or closed store that it could not
// have seen unrenewed for the watch a store keeps before judging its
// owner dead: from its first sight of the claim as it stood to the end of
// its ctx, less than the watch, with modelSlack for the store's polling
// and its goroutines' scheduling.
func (w *world) heldByDead(c *modelCall) bool {
	if !errors.Is(c.err, context.DeadlineExceeded) {
		return false
	}
	c.sightMu.Lock()
	s := c.sight
	c.sightMu.Unlock()
	if s == nil || s.rec.Key != c.key || s.rec.State == backend.StateCompleted || !w.deadToken(s.rec.Token) {
		return false
	}
	watch := modelLease
	if s.rec.State == backend.StatePending {
		watch = max(watch, s.rec.LeaseUntil.Sub(s.rec.CreatedAt))
	}
	if c.deadline.Sub(s.first) >= watch+modelSlack {
		return false
	}
	w.hist.note("  (held by the claim %.8s of a store that died or closed, seen for %v of its ctx)", s.rec.Token, c.deadline.Sub(s.first).Round(time.Millisecond))
	return true
}

// deadToken reports whether token is a claim won by a store that was
// killed or closed since: no one renews it.
func (w *world) deadToken(token string) bool {
	for _, ms := range w.all {
		if (ms.killed || ms.closed.Load()) && ms.f.holds(token) {
			return true
		}
	}
	return false
}
