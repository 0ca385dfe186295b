package idemtest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/seed094d4201/idem/backend"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// endingDeadlines are the ctx lifetimes testEndingContext gives its calls:
// from none to a few milliseconds, so that across them the ctx ends before
// a call, while it waits its turn, while its statement travels or runs, and
// after its answer.
func endingDeadlines() []time.Duration {
	var ds []time.Duration
	for d := time.Duration(0); d < 2*time.Millisecond; d += 40 * time.Microsecond {
		ds = append(ds, d)
	}
	for d := 2 * time.Millisecond; d <= 20*time.Millisecond; d += 2 * time.Millisecond {
		ds = append(ds, d)
	}
	return ds
}

// endingBound is how long after its ctx ends a call may take to return:
// what a commit and a round trip take, not what a wait for a lock does.
const endingBound = 5 * time.Second

// endingLanding is how long testEndingContext gives a write whose caller
// left to land on the server before it looks for it.
const endingLanding = 300 * time.Millisecond

// An endingCall is one call testEndingContext made on a key of its own,
// and how to tell whether its write landed.
type endingCall struct {
	name, key string
	d         time.Duration
	err       error
	landed    func(rec backend.Record, ok bool) bool
}

// testEndingContext: a ctx that ends at any point of a call. The call
// returns within endingBound of its ctx's end; if it returns nil, its write
// landed; if it says it was refused (backend.ErrRefused), it wrote nothing,
// then or later; any other error leaves either, which the Store settles by
// reading back.
func testEndingContext(t *testing.T, b backend.Backend) {
	bg := context.Background()
	var calls []endingCall
	do := func(c endingCall, fn func(ctx context.Context) error) {
		t.Helper()
		ctx, cancel := context.WithTimeout(bg, c.d)
		start := time.Now()
		c.err = fn(ctx)
		took := time.Since(start)
		cancel()
		if took > c.d+endingBound {
			t.Errorf("%s of %s with a ctx of %v returned after %v", c.name, c.key, c.d, took)
		}
		if c.err == nil {
			rec, ok := get(t, b, c.key)
			assert.True(t, c.landed(rec, ok), "%s of %s said ok, but its write is not there: %+v", c.name, c.key, rec)
		}
		calls = append(calls, c)
	}
	for i, d := range endingDeadlines() {
		key := func(op string) string { return fmt.Sprintf("ending-%d-%s", i, op) }

		req := request(key("claim"))
		do(endingCall{name: "Claim", key: req.Key, d: d, landed: func(rec backend.Record, ok bool) bool {
			return ok && rec.Token == req.Token
		}}, func(ctx context.Context) error {
			_, _, err := b.Claim(ctx, req, time.Now(), lease)
			return err
		})

		renewed := claimKey(t, b, key("renew"), shortLease)
		do(endingCall{name: "Renew", key: renewed.Key, d: d, landed: func(rec backend.Record, ok bool) bool {
			return ok && rec.LeaseUntil.After(renewed.LeaseUntil)
		}}, func(ctx context.Context) error {
			return b.Renew(ctx, renewed.Key, renewed.Token, time.Now(), lease)
		})

		completed := claimKey(t, b, key("complete"), lease)
		do(endingCall{name: "Complete", key: completed.Key, d: d, landed: func(rec backend.Record, ok bool) bool {
			return ok && rec.State == backend.StateCompleted
		}}, func(ctx context.Context) error {
			return b.Complete(ctx, outcome(completed, "v"), time.Now(), ttl)
		})

		released := claimKey(t, b, key("release"), lease)
		do(endingCall{name: "Release", key: released.Key, d: d, landed: func(_ backend.Record, ok bool) bool { return !ok }},
			func(ctx context.Context) error { return b.Release(ctx, released.Key, released.Token) })

		forgotten := key("forget")
		claimAndComplete(t, b, forgotten, "v", ttl)
		do(endingCall{name: "Forget", key: forgotten, d: d, landed: func(_ backend.Record, ok bool) bool { return !ok }},
			func(ctx context.Context) error { return b.Forget(ctx, forgotten, time.Now()) })
	}
	// A refused call wrote nothing: not at once, nor once a write its
	// caller left had time to land.
	time.Sleep(endingLanding)
	refused := 0
	for _, c := range calls {
		if !errors.Is(c.err, backend.ErrRefused) {
			continue
		}
		refused++
		rec, ok := get(t, b, c.key)
		assert.False(t, c.landed(rec, ok), "%s of %s with a ctx of %v was refused (%v), but its write landed", c.name, c.key, c.d, c.err)
	}
	require.NotZero(t, refused, "no call was refused: the ctx never ended first")
}
