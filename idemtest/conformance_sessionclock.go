package idemtest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A SessionClockHarness adapts one backend's transactional mode (its
// RunOnceTx) to RunSessionClock.
type SessionClockHarness struct {
	// Backend returns a fresh, empty backend of the kind RunOnceTx needs,
	// registering its cleanup with t.Cleanup.
	Backend func(t *testing.T) backend.Backend

	// RunOnceTx calls the backend's RunOnceTx with fn. Inside fn, shift
	// moves the clock of the database session fn's transaction runs in
	// by d, as far as the database lets a session: MySQL and MariaDB
	// with SET timestamp, which NOW() and UTC_TIMESTAMP() follow. A
	// database whose sessions cannot move their clock passes the nearest
	// thing it has (PostgreSQL: SET LOCAL TIME ZONE, which moves no
	// instant), or a shift that does nothing (SQLite and bolt, whose
	// instants are the store's Options.Now).
	RunOnceTx func(ctx context.Context, s *idem.Store[int], key string, payload any, fn func(ctx context.Context, shift func(d time.Duration) error) (int, error)) (int, error)
}

// RunSessionClock checks that a transactional mode (RunOnceTx) takes the
// instants it records from a clock that fn's session cannot move: fn may
// set its session's clock back or ahead by twice the TTL, and its outcome
// is still remembered for the TTL from when it was recorded (a clock set
// back would record it expired already, and the next call would run fn
// again), no longer, and the next call replays it, in this store and in
// another over the same backend. Nor does the moved clock follow the
// session's connection back to a pool, where a later claim would read it.
// Run it besides the backend's other transactional tests.
func RunSessionClock(t *testing.T, h SessionClockHarness) {
	for _, tc := range []struct {
		name  string
		shift time.Duration
		final bool // fn returns a final error: recorded, fn's writes rolled back
	}{
		{"Back", -2 * sessionTTL, false},
		{"Ahead", 2 * sessionTTL, false},
		{"BackFinalError", -2 * sessionTTL, true},
	} {
		t.Run(tc.name, func(t *testing.T) { testSessionClock(t, h, tc.shift, tc.final) })
	}
}

// sessionTTL is the TTL of the outcomes RunSessionClock records: the
// day a payment API keeps a key.
const sessionTTL = 24 * time.Hour

// errDeclined is the final error fn returns in the final-error cases.
var errDeclined = errors.New("card declined")

func testSessionClock(t *testing.T, h SessionClockHarness, shift time.Duration, final bool) {
	ctx := context.Background()
	b := h.Backend(t)
	newStore := func() *idem.Store[int] {
		s := idem.New[int](idem.Options{Backend: b, TTL: sessionTTL, SweepInterval: -1})
		t.Cleanup(func() { s.Close() })
		return s
	}
	s := newStore()
	calls := 0
	fn := func(ctx context.Context, move func(time.Duration) error) (int, error) {
		calls++
		if err := move(shift); err != nil {
			return 0, err
		}
		if final {
			return 0, idem.Final(errDeclined)
		}
		return 7, nil
	}
	check := func(v int, err error, msg string) {
		t.Helper()
		if final {
			assert.True(t, idem.IsFinal(err), "%s: the final error: %v", msg, err)
			assert.ErrorContains(t, err, errDeclined.Error(), msg)
			return
		}
		require.NoError(t, err, msg)
		assert.Equal(t, 7, v, msg)
	}

	before := time.Now()
	v, err := h.RunOnceTx(ctx, s, "moved", "p", fn)
	after := time.Now()
	check(v, err, "the first call")
	require.Equal(t, 1, calls)

	// The record expires a TTL after it was recorded, by the real clock.
	rec, ok, err := b.Get(ctx, "moved", time.Now())
	require.NoError(t, err)
	require.True(t, ok, "fn set its session's clock %v away and its outcome, a TTL of %v, reads as expired or absent", shift, sessionTTL)
	assert.Equal(t, backend.StateCompleted, rec.State)
	assertNear(t, before.Add(sessionTTL), after.Add(sessionTTL), rec.ExpiresAt, "the outcome's expiry, fn having set its session's clock %v away", shift)

	// Retries replay, here and in another process.
	v, err = h.RunOnceTx(ctx, s, "moved", "p", fn)
	check(v, err, "a retry in the same store")
	v, err = h.RunOnceTx(ctx, newStore(), "moved", "p", fn)
	check(v, err, "a retry in another store over the backend")
	assert.Equal(t, 1, calls, "fn ran again within the TTL: its session's clock moved by %v decided the expiry", shift)

	// The next calls meet the server's clock, on whichever connection.
	before = time.Now()
	_, err = s.RunOnce(ctx, "next", "p", func(context.Context) (int, error) { return 1, nil })
	require.NoError(t, err)
	_, err = h.RunOnceTx(ctx, s, "next-tx", "p", func(context.Context, func(time.Duration) error) (int, error) { return 1, nil })
	require.NoError(t, err)
	after = time.Now()
	for _, key := range []string{"next", "next-tx"} {
		rec, ok, err := b.Get(ctx, key, time.Now())
		require.NoError(t, err)
		require.True(t, ok, "%s: recorded", key)
		assertNear(t, before, after, rec.CreatedAt, "%s: the claim's instant after a session's clock moved", key)
		assertNear(t, before.Add(sessionTTL), after.Add(sessionTTL), rec.ExpiresAt, "%s: the expiry after a session's clock moved", key)
	}
}

// sessionSlack is how far a database server's clock may be from this
// process's: far less than the shifts RunSessionClock makes.
const sessionSlack = time.Minute

// assertNear checks that got lies between from and to, give or take
// sessionSlack.
func assertNear(t *testing.T, from, to, got time.Time, msg string, args ...any) {
	t.Helper()
	if got.Before(from.Add(-sessionSlack)) || got.After(to.Add(sessionSlack)) {
		t.Errorf("%v is not between %v and %v (± %v): %s", got, from.Round(0), to.Round(0), sessionSlack, fmt.Sprintf(msg, args...))
	}
}
