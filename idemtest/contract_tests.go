package idemtest

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// contractTests are the tests RunContract runs through each entry point.
// Those in contract_durable.go need a backend, or skip.
var contractTests = []struct {
	name string
	test func(*contract)
}{
	{"Coalesces", testCoalesces},
	{"PayloadMismatch", testPayloadMismatch},
	{"ErrorReleasesKey", testErrorReleasesKey},
	{"FinalErrorIsReplayed", testFinalErrorIsReplayed},
	{"PanicReleasesKey", testPanicReleasesKey},
	{"CancelledFirstCallerLeavesExecution", testCancelledFirstCaller},
	{"WaiterContextEnds", testWaiterContextEnds},
	{"InvalidKey", testInvalidKey},
	{"ClosedStoreRefuses", testClosedStoreRefuses},
	{"TTLExpiresOnClock", testTTLExpiresOnClock},
	{"TTLExpiresOnRealTime", testTTLExpiresOnRealTime},
	{"LeaseIsRenewed", testLeaseIsRenewed},
	{"LostLeaseIsFenced", testLostLeaseIsFenced},
	{"OutcomeSurvivesRestart", testOutcomeSurvivesRestart},
	{"CrashIsOutcomeUnknown", testCrashIsOutcomeUnknown},
	{"ResolveInterrupted", testResolveInterrupted},
	{"RecordsListsInterruptedFirst", testRecordsListsInterruptedFirst},
	{"WaitForOtherStoreEndsWithContext", testWaitForOtherStore},
	{"FailedRunResumesAtOnceElsewhere", testFailedRunResumesAtOnceElsewhere},
}

// bounded returns a context that ends after contractTimeout, for calls
// that could wait on something the test holds.
func (c *contract) bounded() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), contractTimeout)
	c.t.Cleanup(cancel)
	return ctx
}

// record returns key's record in the test's backend, by the real clock.
func (c *contract) record(key string) (backend.Record, bool) {
	c.t.Helper()
	rec, ok, err := c.b.Get(context.Background(), key, time.Now())
	require.NoError(c.t, err)
	return rec, ok
}

// blocked returns fn that counts its call, closes started, waits for g and
// returns v and err.
func blocked(calls *atomic.Int32, started chan<- struct{}, g *gate, v receipt, err error) work {
	return func(context.Context) (receipt, error) {
		calls.Add(1)
		close(started)
		g.wait()
		return v, err
	}
}

// Fifty callers with one key while fn runs: fn runs once, and every caller
// gets its result.
func testCoalesces(c *contract) {
	t := c.t
	const callers = 50
	s := c.store(idem.Options{})
	var calls atomic.Int32
	fn := func(context.Context) (receipt, error) {
		n := calls.Add(1)
		// Hold the execution until every duplicate waits on it.
		if !parked(callers - 1) {
			t.Errorf("the %d duplicates never all parked on the execution in flight", callers-1)
		}
		return receipt{N: int(n)}, nil
	}
	// Half the callers can leave (RunOnce then runs fn on a goroutine of
	// its own), half cannot (the first of them runs fn itself).
	leavable, cancel := context.WithCancel(context.Background())
	defer cancel()
	start := make(chan struct{})
	results := make([]result, callers)
	var wg sync.WaitGroup
	for i := range callers {
		ctx := context.Background()
		if i%2 == 1 {
			ctx = leavable
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			results[i] = c.catch(s, ctx, "coalesce", "order-101", fn)
		}()
	}
	close(start)
	wg.Wait()

	assert.Equal(t, int32(1), calls.Load(), "fn must run exactly once")
	for i, r := range results {
		require.Nil(t, r.panicked, "caller %d", i)
		require.NoError(t, r.err, "caller %d", i)
		require.Equal(t, receipt{N: 1}, r.val, "caller %d", i)
	}
	if c.b != nil {
		rec, ok := c.record("coalesce")
		require.True(t, ok, "the outcome is in the backend")
		assert.Equal(t, backend.StateCompleted, rec.State)
	}
}

// A key reused with another payload is refused while the first execution
// runs and after it finished, in this store and in another over the same
// backend; the first execution goes on undisturbed.
func testPayloadMismatch(c *contract) {
	t := c.t
	s := c.store(idem.Options{})
	stores := []*idem.Store[receipt]{s}
	if c.b != nil {
		stores = append(stores, c.store(idem.Options{}))
	}
	g := newGate()
	defer g.open()
	started := make(chan struct{})
	var calls, others atomic.Int32
	owner := c.async(s, context.Background(), "k", "p1", blocked(&calls, started, g, receipt{N: 7}, nil))
	recv(t, started, "fn to start")

	for i, st := range stores {
		_, err := c.run(st, c.bounded(), "k", "p2", counting(&others))
		assert.ErrorIs(t, err, idem.ErrPayloadMismatch, "store %d, while the key is in flight", i)
	}
	g.open()
	o := recv(t, owner, "the first execution")
	require.Nil(t, o.panicked)
	require.NoError(t, o.err, "the first execution is undisturbed")
	assert.Equal(t, receipt{N: 7}, o.val)

	for i, st := range stores {
		_, err := c.run(st, c.bounded(), "k", "p2", counting(&others))
		assert.ErrorIs(t, err, idem.ErrPayloadMismatch, "store %d, once the outcome is remembered", i)
		v, err := c.run(st, c.bounded(), "k", "p1", counting(&others))
		require.NoError(t, err, "store %d: the first payload replays", i)
		assert.Equal(t, receipt{N: 7}, v, "store %d", i)
	}
	assert.Zero(t, others.Load(), "fn ran for a refused or replayed call")
	assert.Equal(t, int32(1), calls.Load())
}

// An ordinary error releases the key: the caller and a duplicate waiting on
// it get the error, nothing is remembered, and the next call runs fn again.
func testErrorReleasesKey(c *contract) {
	t := c.t
	s := c.store(idem.Options{})
	errTransient := errors.New("bank unreachable")
	g := newGate()
	defer g.open()
	started := make(chan struct{})
	var calls, waiterCalls atomic.Int32
	owner := c.async(s, context.Background(), "k", "p", blocked(&calls, started, g, receipt{}, errTransient))
	recv(t, started, "fn to start")
	waiter := c.async(s, c.bounded(), "k", "p", counting(&waiterCalls))
	require.True(t, parked(1), "the duplicate never parked on the execution in flight")
	g.open()

	for _, o := range []result{recv(t, owner, "the caller"), recv(t, waiter, "the waiter")} {
		require.Nil(t, o.panicked)
		assert.ErrorIs(t, o.err, errTransient)
		assert.False(t, idem.IsFinal(o.err), "a transient error is not final")
	}
	assert.Zero(t, waiterCalls.Load(), "the waiter ran fn itself")
	if c.b != nil {
		_, ok := c.record("k")
		assert.False(t, ok, "a failure before commit leaves no record")
	}

	v, err := c.run(s, context.Background(), "k", "p", counting(&calls))
	require.NoError(t, err)
	assert.Equal(t, receipt{N: 2}, v, "the next call runs fn again")
	v, err = c.run(s, context.Background(), "k", "p", counting(&calls))
	require.NoError(t, err)
	assert.Equal(t, receipt{N: 2}, v, "and its success is remembered")
	assert.Equal(t, int32(2), calls.Load())
}

// An error marked Final is remembered and replayed, by this store and by
// another over the same backend, and fn does not run again.
func testFinalErrorIsReplayed(c *contract) {
	t := c.t
	s := c.store(idem.Options{})
	errDeclined := errors.New("card declined")
	var calls atomic.Int32
	decline := func(context.Context) (receipt, error) {
		calls.Add(1)
		return receipt{}, idem.Final(errDeclined)
	}
	_, err := c.run(s, context.Background(), "k", "p", decline)
	require.Error(t, err)
	assert.True(t, idem.IsFinal(err))
	assert.ErrorIs(t, err, errDeclined, "the first caller gets fn's error")

	stores := []*idem.Store[receipt]{s}
	if c.b != nil {
		stores = append(stores, c.store(idem.Options{}))
	}
	for i, st := range stores {
		_, err := c.run(st, context.Background(), "k", "p", decline)
		require.Error(t, err, "store %d: the final error is replayed", i)
		assert.True(t, idem.IsFinal(err), "store %d: a replayed final error is final", i)
		assert.Equal(t, "card declined", err.Error(), "store %d", i)
		if c.b == nil {
			assert.ErrorIs(t, err, errDeclined, "in memory the replay is fn's error itself")
		}
	}
	assert.Equal(t, int32(1), calls.Load(), "fn ran again for a remembered final error")
}

// A panic in fn releases the key: a duplicate waiting on it gets a
// *PanicError, the caller gets one too (RunOnce) or the panic goes on up
// its stack (Begin), and the store goes on: the next call runs fn again.
func testPanicReleasesKey(c *contract) {
	t := c.t
	s := c.store(idem.Options{})
	const boom = "boom"
	g := newGate()
	defer g.open()
	started := make(chan struct{})
	owner := c.async(s, context.Background(), "k", "p", func(context.Context) (receipt, error) {
		close(started)
		g.wait()
		panic(boom)
	})
	recv(t, started, "fn to start")
	var calls atomic.Int32
	waiter := c.async(s, c.bounded(), "k", "p", counting(&calls))
	require.True(t, parked(1), "the duplicate never parked on the execution in flight")
	g.open()

	o := recv(t, owner, "the caller whose fn panicked")
	var pe *idem.PanicError
	if c.ep.panics {
		assert.Equal(t, boom, o.panicked, "the panic goes on up the caller's stack")
	} else {
		require.Nil(t, o.panicked, "the panic reached the caller's stack")
		require.ErrorAs(t, o.err, &pe)
		assert.Equal(t, boom, pe.Value)
		assert.NotEmpty(t, pe.Stack)
	}
	w := recv(t, waiter, "the waiter")
	require.Nil(t, w.panicked)
	if c.ep.panics {
		// Release recovers nothing: the waiter is told the key was
		// released, and the panic went on up its owner's stack.
		require.ErrorContains(t, w.err, "released before it finished")
		assert.False(t, idem.IsFinal(w.err))
	} else {
		require.ErrorAs(t, w.err, &pe, "the waiter gets the panic as an error")
		assert.Equal(t, boom, pe.Value)
	}
	assert.Zero(t, calls.Load(), "the waiter ran fn itself")
	if c.b != nil {
		_, ok := c.record("k")
		assert.False(t, ok, "a panic leaves no record")
	}

	v, err := c.run(s, context.Background(), "k", "p", counting(&calls))
	require.NoError(t, err, "the key was released")
	assert.Equal(t, receipt{N: 1}, v)
	v, err = c.run(s, c.bounded(), "other", "p", counting(&calls))
	require.NoError(t, err, "the store stays usable")
	assert.Equal(t, receipt{N: 2}, v)
}

// The first caller's cancellation does not reach fn: the execution goes on
// and its outcome is remembered. Through RunOnce that caller leaves with
// ErrInProgress at once.
func testCancelledFirstCaller(c *contract) {
	t := c.t
	s := c.store(idem.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	g := newGate()
	defer g.open()
	started := make(chan struct{})
	fnErr := make(chan error, 1)
	var calls atomic.Int32
	owner := c.async(s, ctx, "k", "p", func(ctx context.Context) (receipt, error) {
		calls.Add(1)
		close(started)
		g.wait()
		fnErr <- ctx.Err()
		return receipt{N: 3}, nil
	})
	recv(t, started, "fn to start")
	cancel()
	if c.ep.leaves {
		o := recv(t, owner, "the first caller to leave")
		assert.ErrorIs(t, o.err, idem.ErrInProgress)
		assert.ErrorIs(t, o.err, context.Canceled)
	}
	g.open()
	assert.NoError(t, recv(t, fnErr, "fn to return"), "fn's context ended with its first caller's")
	if !c.ep.leaves {
		o := recv(t, owner, "the first caller")
		require.Nil(t, o.panicked)
		require.NoError(t, o.err)
		assert.Equal(t, receipt{N: 3}, o.val)
	}
	v, err := c.run(s, c.bounded(), "k", "p", counting(&calls))
	require.NoError(t, err)
	assert.Equal(t, receipt{N: 3}, v, "the execution its first caller left was remembered")
	assert.Equal(t, int32(1), calls.Load())
}

// A duplicate whose ctx ends while it waits for the execution in flight in
// its own store leaves with an error that is both ErrInProgress and its
// ctx's, at once; the execution goes on.
func testWaiterContextEnds(c *contract) {
	s := c.store(idem.Options{})
	waitWithDeadline(c, s, s)
}

// waitWithDeadline runs fn in owner, and checks that a duplicate in waiter
// whose ctx ends first leaves with ErrInProgress and the ctx's error
// within a bound, while a patient one gets fn's outcome.
func waitWithDeadline(c *contract, owner, waiter *idem.Store[receipt]) {
	t := c.t
	g := newGate()
	defer g.open()
	started := make(chan struct{})
	var calls, others atomic.Int32
	first := c.async(owner, context.Background(), "k", "p", blocked(&calls, started, g, receipt{N: 4}, nil))
	recv(t, started, "fn to start")

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	begun := time.Now()
	impatient := recv(t, c.async(waiter, ctx, "k", "p", counting(&others)), "a duplicate whose ctx ended")
	took := time.Since(begun)
	require.Nil(t, impatient.panicked)
	assert.ErrorIs(t, impatient.err, idem.ErrInProgress)
	assert.ErrorIs(t, impatient.err, context.DeadlineExceeded)
	assert.Less(t, took, 1500*time.Millisecond, "the duplicate waited past its ctx") // its ctx, and slack for a loaded machine

	patient := c.async(waiter, c.bounded(), "k", "p", counting(&others))
	g.open()
	for _, o := range []result{recv(t, first, "the first caller"), recv(t, patient, "a patient duplicate")} {
		require.Nil(t, o.panicked)
		require.NoError(t, o.err)
		assert.Equal(t, receipt{N: 4}, o.val)
	}
	v, err := c.run(waiter, context.Background(), "k", "p", counting(&others))
	require.NoError(t, err)
	assert.Equal(t, receipt{N: 4}, v)
	assert.Zero(t, others.Load(), "a duplicate ran fn")
	assert.Equal(t, int32(1), calls.Load())
}

// Keys the contract refuses never reach fn.
func testInvalidKey(c *contract) {
	t := c.t
	s := c.store(idem.Options{})
	var calls atomic.Int32
	for _, key := range []string{"", "line\nbreak", strings.Repeat("k", 256), "\xff"} {
		_, err := c.run(s, context.Background(), key, "p", counting(&calls))
		assert.ErrorIs(t, err, idem.ErrInvalidKey, "key %q", key)
	}
	assert.Zero(t, calls.Load())
}

// A closed store refuses every call, remembered keys included; what it
// recorded in a backend stays there.
func testClosedStoreRefuses(c *contract) {
	t := c.t
	s := c.store(idem.Options{})
	var calls atomic.Int32
	v, err := c.run(s, context.Background(), "k", "p", counting(&calls))
	require.NoError(t, err)
	require.NoError(t, s.Close())
	for _, key := range []string{"k", "new"} {
		_, err = c.run(s, context.Background(), key, "p", counting(&calls))
		assert.ErrorIs(t, err, idem.ErrClosed, "key %q", key)
	}
	assert.Equal(t, int32(1), calls.Load())
	if c.b != nil {
		got, err := c.run(c.store(idem.Options{}), context.Background(), "k", "p", counting(&calls))
		require.NoError(t, err)
		assert.Equal(t, v, got, "another store replays what the closed one recorded")
		assert.Equal(t, int32(1), calls.Load())
	}
}

// An outcome is replayed until its TTL passes by Options.Now, and fn runs
// again after.
func testTTLExpiresOnClock(c *contract) {
	t := c.t
	if c.h.ServerClock {
		t.Skip("the backend ignores Options.Now: TTLExpiresOnRealTime covers expiry")
	}
	clock := NewClock(time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC))
	opts := idem.Options{TTL: time.Hour, Now: clock.Now}
	s := c.store(opts)
	stores := []*idem.Store[receipt]{s}
	if c.b != nil {
		stores = append(stores, c.store(opts))
	}
	var calls atomic.Int32
	_, err := c.run(s, context.Background(), "k", "p", counting(&calls))
	require.NoError(t, err)
	clock.Advance(59 * time.Minute)
	for i, st := range stores {
		v, err := c.run(st, context.Background(), "k", "p", counting(&calls))
		require.NoError(t, err)
		assert.Equal(t, receipt{N: 1}, v, "store %d: replayed before the TTL passed", i)
	}
	clock.Advance(2 * time.Minute)
	v, err := c.run(s, context.Background(), "k", "p", counting(&calls))
	require.NoError(t, err)
	assert.Equal(t, receipt{N: 2}, v, "fn runs again once the outcome expired")
	for i, st := range stores {
		v, err := c.run(st, context.Background(), "k", "p", counting(&calls))
		require.NoError(t, err)
		assert.Equal(t, receipt{N: 2}, v, "store %d: the new outcome is replayed", i)
	}
	assert.Equal(t, int32(2), calls.Load())
}
