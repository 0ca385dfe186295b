package idemtest

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The contract tests that need stores over a backend: expiry judged by the
// backend's clock, leases, restarts, crashes, and keys in flight in another
// store. They run on the real clock, since a shared backend judges time by
// its server's.

// An outcome recorded in the backend is replayed until its TTL passes, by
// whatever clock the backend keeps, and never expires early.
func testTTLExpiresOnRealTime(c *contract) {
	t := c.t
	c.needBackend()
	const ttl = time.Second
	s := c.store(idem.Options{TTL: ttl})
	var calls atomic.Int32
	begun := time.Now()
	v, err := c.run(s, context.Background(), "k", "p", counting(&calls))
	require.NoError(t, err)
	require.Equal(t, receipt{N: 1}, v)
	v, err = c.run(s, context.Background(), "k", "p", counting(&calls))
	require.NoError(t, err)
	if time.Since(begun) < ttl/2 { // surely before the expiry, on any clock
		assert.Equal(t, receipt{N: 1}, v, "replayed before the TTL passed")
		assert.Equal(t, int32(1), calls.Load())
	}
	expired := poll(func() bool {
		v, err = c.run(s, c.bounded(), "k", "p", counting(&calls))
		require.NoError(t, err)
		if calls.Load() == 1 {
			require.Equal(t, receipt{N: 1}, v, "a replay before expiry")
		}
		return calls.Load() > 1
	})
	took := time.Since(begun)
	require.True(t, expired, "the outcome never expired")
	assert.Equal(t, receipt{N: 2}, v, "fn runs again once the outcome expired")
	assert.GreaterOrEqual(t, took, ttl-50*time.Millisecond, "the outcome expired before its TTL")
	assert.Equal(t, int32(2), calls.Load())
}

// An fn that outlives its lease keeps its claim while the store renews
// it: another store finds the key in progress, not free or interrupted.
func testLeaseIsRenewed(c *contract) {
	t := c.t
	c.needBackend()
	// Long enough that a claim or a renewal delayed by a slow disk (a
	// loaded CI machine's fsync can take 200 ms) still lands within the
	// store's trust of 0.9 lease and a renewal's bound of lease/3.
	const lease = time.Second
	s := c.store(idem.Options{Lease: lease})
	other := c.store(idem.Options{RetryInterrupted: true}) // would take an interrupted key over
	var calls atomic.Int32
	var probes []error
	var cause error
	fn := func(ctx context.Context) (receipt, error) {
		calls.Add(1)
		begun := time.Now()
		for _, at := range []time.Duration{2 * lease, 3 * lease} {
			if !sleepUntil(ctx, begun.Add(at)) {
				break
			}
			pctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			o, ok := within(c.async(other, pctx, "k", "p", counting(&calls)), time.Second)
			cancel()
			if !ok {
				o.err = errors.New("the other store's call outlived its ctx by a second")
			}
			probes = append(probes, o.err)
		}
		sleepUntil(ctx, begun.Add(3*lease+lease/4))
		cause = context.Cause(ctx)
		return receipt{N: 100}, nil
	}
	v, err := c.run(s, context.Background(), "k", "p", fn)
	require.NoError(t, err)
	assert.Equal(t, receipt{N: 100}, v)
	assert.NoError(t, cause, "fn's context ended: the store stopped trusting a lease it renewed")
	require.Len(t, probes, 2, "fn was cut short")
	for i, err := range probes {
		assert.ErrorIs(t, err, idem.ErrInProgress, "probe %d: another store must find the key in progress", i)
		assert.ErrorIs(t, err, context.DeadlineExceeded, "probe %d", i)
	}
	assert.Equal(t, int32(1), calls.Load(), "another store ran the key while its owner held the lease")
	v, err = c.run(other, c.bounded(), "k", "p", counting(&calls))
	require.NoError(t, err)
	assert.Equal(t, receipt{N: 100}, v, "the other store replays the outcome")
	assert.Equal(t, int32(1), calls.Load())
}

// sleepUntil waits until deadline and reports true, or reports false as
// soon as ctx ends.
func sleepUntil(ctx context.Context, deadline time.Time) bool {
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// When an owner's renewals cannot get through, its lease lapses and
// another store (with RetryInterrupted) takes the key over: the first
// owner's fn is told (ErrLeaseLost), its outcome is refused rather than
// written over the second (the Observer is told of a *NotRecordedError
// matching backend.ErrNotOwner; the caller is answered its own result),
// and every store then replays the second outcome.
func testLostLeaseIsFenced(c *contract) {
	t := c.t
	c.needBackend()
	const lease = time.Second // the stale store must be trusted long enough to start fn, however slow the disk
	errPartition := errors.New("network partition")
	partitioned := Faulty{Backend: c.b, Fail: func(op string) error {
		if op == "Renew" {
			return errPartition
		}
		return nil
	}}
	var un Unrecorded
	stale := c.store(idem.Options{Backend: partitioned, Lease: lease, Observer: un.Observer()})
	// The taker watches the lapsed claim for a whole lease of its own
	// before it takes it over: stores sharing a backend share a lease.
	taker := c.store(idem.Options{RetryInterrupted: true, Lease: lease})
	started := make(chan struct{})
	taken := newGate()
	defer taken.open()
	var calls atomic.Int32
	var cause error
	owner := c.async(stale, context.Background(), "k", "p", func(ctx context.Context) (receipt, error) {
		calls.Add(1)
		close(started)
		timeout := time.NewTimer(contractTimeout)
		defer timeout.Stop()
		select {
		case <-ctx.Done():
			cause = context.Cause(ctx)
		case <-timeout.C:
		}
		select { // the stale owner finishes after the new one, all the same
		case <-taken.opened():
		case <-timeout.C:
		}
		return receipt{N: 1}, nil
	})
	recv(t, started, "fn to start")

	v, err := c.run(taker, c.bounded(), "k", "p", func(context.Context) (receipt, error) {
		calls.Add(1)
		return receipt{N: 2}, nil
	})
	require.NoError(t, err, "the other store takes the interrupted key over")
	assert.Equal(t, receipt{N: 2}, v)
	taken.open()

	o := recv(t, owner, "the stale owner")
	require.Nil(t, o.panicked)
	assert.ErrorIs(t, cause, idem.ErrLeaseLost, "the stale owner's fn learns its lease is lost")
	require.NoError(t, o.err, "the stale owner's work took effect")
	assert.Equal(t, receipt{N: 1}, o.val, "the stale owner is told its result")
	assert.ErrorIs(t, un.Of("k"), backend.ErrNotOwner, "the Observer is told the outcome was not recorded")

	rec, ok := c.record("k")
	require.True(t, ok)
	assert.Equal(t, backend.StateCompleted, rec.State, "the backend keeps the second outcome")
	for i, st := range []*idem.Store[receipt]{stale, taker, c.store(idem.Options{})} {
		v, err := c.run(st, c.bounded(), "k", "p", counting(&calls))
		require.NoError(t, err, "store %d", i)
		assert.Equal(t, receipt{N: 2}, v, "store %d replays the second outcome", i)
	}
	assert.Equal(t, int32(2), calls.Load())
}

// What one store recorded, a success or a final error, a new store over
// the backend (reopened, if the harness can) replays without calling fn.
func testOutcomeSurvivesRestart(c *contract) {
	t := c.t
	c.needBackend()
	first := c.store(idem.Options{})
	var calls, declines atomic.Int32
	decline := func(context.Context) (receipt, error) {
		declines.Add(1)
		return receipt{}, idem.Final(errors.New("card declined"))
	}
	v, err := c.run(first, context.Background(), "ok", "p", counting(&calls))
	require.NoError(t, err)
	require.Equal(t, receipt{N: 1}, v)
	_, err = c.run(first, context.Background(), "declined", "p", decline)
	require.True(t, idem.IsFinal(err))
	require.NoError(t, first.Close())
	c.reopen()

	s := c.store(idem.Options{})
	v, err = c.run(s, c.bounded(), "ok", "p", counting(&calls))
	require.NoError(t, err)
	assert.Equal(t, receipt{N: 1}, v, "the outcome outlives its store")
	_, err = c.run(s, c.bounded(), "declined", "p", decline)
	require.Error(t, err)
	assert.True(t, idem.IsFinal(err), "the final error outlives its store")
	assert.Equal(t, "card declined", err.Error())
	_, err = c.run(s, c.bounded(), "ok", "another payload", counting(&calls))
	assert.ErrorIs(t, err, idem.ErrPayloadMismatch)
	assert.Equal(t, int32(1), calls.Load())
	assert.Equal(t, int32(1), declines.Load())
}

// A key claimed by an owner that stopped before recording an outcome is
// interrupted: ErrOutcomeUnknown, not run again and not expiring on its
// own, until Forget, after which fn runs; a store with RetryInterrupted
// runs it again at once.
func testCrashIsOutcomeUnknown(c *contract) {
	t := c.t
	c.needBackend()
	ctx := context.Background()
	c.deadClaims("dead-owner-", "crashed", "crashed-retried")

	// A lapsed claim is watched for a whole lease (the dead owners'
	// one) before it is taken for interrupted, never for longer.
	s := c.store(idem.Options{Lease: deadLease})
	var calls atomic.Int32
	var err error
	for range 2 {
		_, err = c.run(s, c.bounded(), "crashed", "p", counting(&calls))
		assert.ErrorIs(t, err, idem.ErrOutcomeUnknown)
		assert.NotErrorIs(t, err, idem.ErrInProgress, "an interrupted key is not waited for past the watch")
	}
	_, err = c.run(s, c.bounded(), "crashed", "another payload", counting(&calls))
	assert.ErrorIs(t, err, idem.ErrPayloadMismatch)
	assert.Zero(t, calls.Load(), "an interrupted key ran again on its own")

	require.NoError(t, s.Forget(ctx, "crashed"))
	v, err := c.run(s, c.bounded(), "crashed", "p", counting(&calls))
	require.NoError(t, err)
	assert.Equal(t, receipt{N: 1}, v, "a forgotten key runs again")
	v, err = c.run(s, c.bounded(), "crashed", "p", counting(&calls))
	require.NoError(t, err)
	assert.Equal(t, receipt{N: 1}, v)

	retrying := c.store(idem.Options{RetryInterrupted: true, Lease: deadLease})
	v, err = c.run(retrying, c.bounded(), "crashed-retried", "p", counting(&calls))
	require.NoError(t, err)
	assert.Equal(t, receipt{N: 2}, v, "RetryInterrupted runs an interrupted key again")
	assert.Equal(t, int32(2), calls.Load())
}

// A duplicate whose ctx ends while the key is in flight in another store
// over the backend leaves with ErrInProgress and its ctx's error, at once;
// a patient one gets the other store's outcome.
func testWaitForOtherStore(c *contract) {
	c.needBackend()
	waitWithDeadline(c, c.store(idem.Options{}), c.store(idem.Options{}))
}

// deadClaims claims keys in the backend, with payload "p" and a 100 ms
// lease, as stores whose owners then die make them; restarts the backend
// (Reopen, where the harness has one); and waits until every claim reads
// as interrupted.
// deadLease is the lease of deadClaims' claims.
const deadLease = 100 * time.Millisecond

func (c *contract) deadClaims(tokenPrefix string, keys ...string) {
	t := c.t
	fp, err := idem.DefaultFingerprint("p")
	require.NoError(t, err)
	for _, key := range keys {
		claim := backend.Record{Key: key, Fingerprint: fp, Token: tokenPrefix + key, State: backend.StatePending}
		_, won, err := c.b.Claim(context.Background(), claim, time.Now(), deadLease)
		require.NoError(t, err)
		require.True(t, won)
	}
	c.reopen()
	require.True(t, poll(func() bool {
		for _, key := range keys {
			if rec, ok := c.record(key); !ok || rec.State != backend.StateInterrupted {
				return false
			}
		}
		return true
	}), "the dead owners' claims never read as interrupted")
}

// With Resume, a run that fails after a recorded step lets its claim go,
// and another store resumes it at once, on any backend, however long the
// lease: the step does not run again, the rest does. (A lapse alone would
// make the other store watch the claim for a whole lease first.)
func testFailedRunResumesAtOnceElsewhere(c *contract) {
	t := c.t
	c.needBackend()
	if _, ok := c.b.(backend.Stepper); !ok {
		t.Skip("the backend records no steps")
	}
	opts := idem.Options{Resume: true, Lease: time.Hour}
	first, other := c.store(opts), c.store(opts)
	var charges atomic.Int32
	charge := func(ctx context.Context) (int, error) { return int(charges.Add(1)), nil }
	boom := errors.New("after the charge")
	_, err := c.run(first, context.Background(), "k", "p", func(ctx context.Context) (receipt, error) {
		if _, err := idem.Step(ctx, "charge", charge); err != nil {
			return receipt{}, err
		}
		return receipt{}, boom
	})
	require.ErrorIs(t, err, boom)

	start := time.Now()
	v, err := c.run(other, c.bounded(), "k", "p", func(ctx context.Context) (receipt, error) {
		n, err := idem.Step(ctx, "charge", charge)
		return receipt{N: n}, err
	})
	require.NoError(t, err, "the other store resumes the key")
	assert.Equal(t, receipt{N: 1}, v, "the recorded step answers without running")
	assert.Equal(t, int32(1), charges.Load())
	assert.Less(t, time.Since(start), contractTimeout/2, "resumed at once, not after the lease")
}
