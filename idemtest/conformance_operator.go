package idemtest

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Operator describes a shared backend under settings its server's
// operator may choose, for RunOperator. The checks that need a nil field
// are skipped.
type Operator struct {
	// WaitLimited returns an empty backend whose server cuts short any
	// statement that waits longer than WaitLimit on a lock: PostgreSQL's
	// statement_timeout or lock_timeout, MySQL's innodb_lock_wait_timeout,
	// MariaDB's max_statement_time, set for the role, the database or
	// the session. Register its cleanup with t.Cleanup.
	WaitLimited func(t *testing.T) backend.Backend
	// WaitLimit is that limit: a fraction of a second keeps the checks
	// short.
	WaitLimit time.Duration
	// RunOnceTx runs fn in the backend's transactional mode on s, whose
	// Backend WaitLimited made, with a nil payload (the checks make
	// duplicates with RunOnce too): key's record and fn's outcome commit in
	// one transaction, which stays open while fn runs. Nil skips the
	// checks that need it.
	RunOnceTx func(ctx context.Context, s *idem.Store[string], key string, fn func(context.Context) (string, error)) (string, error)

	// Evicting returns an empty backend, with its default options, over a
	// server that evicts records under memory pressure (a Redis with
	// maxmemory and maxmemory-policy allkeys-lru). Register its cleanup
	// with t.Cleanup.
	Evicting func(t *testing.T) backend.Backend
	// Evict makes b's server evict key's record, if it holds one, as
	// memory pressure would.
	Evict func(t *testing.T, b backend.Backend, key string)
}

// RunOperator checks that a shared backend keeps the contract under its
// operator's settings:
//
//   - A server that cuts a lock wait short (WaitLimited): a duplicate of
//     a key held in an open transaction (RunOnceTx, on a new key or
//     taking over an expired record) waits for that transaction to end,
//     however many limits pass, as long as its own ctx lasts, and then
//     replays its outcome, whether it comes through RunOnceTx or RunOnce;
//     a Forget of that key succeeds (it found no committed record, or
//     waited), or is refused as in progress, never failed with the
//     server's timeout.
//   - A server that evicts records (Evicting): no eviction lets an
//     operation run twice. The backend may refuse to work on such a
//     server, as the redis backend does by default.
func RunOperator(t *testing.T, o Operator) {
	if o.WaitLimited != nil {
		require.Positive(t, o.WaitLimit, "Operator.WaitLimit")
		if o.RunOnceTx != nil {
			for _, old := range []bool{false, true} {
				name := "NewKey"
				if old {
					name = "ExpiredKey"
				}
				t.Run(name, func(t *testing.T) {
					t.Run("TxDuplicateWaitsPastTheLimit", func(t *testing.T) { testDuplicateWaits(t, o, old, true) })
					t.Run("DuplicateWaitsPastTheLimit", func(t *testing.T) { testDuplicateWaits(t, o, old, false) })
					t.Run("ForgetOfAKeyInATransaction", func(t *testing.T) { testForgetInTx(t, o, old) })
				})
			}
		}
	}
	if o.Evicting != nil {
		require.NotNil(t, o.Evict, "Operator.Evict")
		t.Run("EvictedOutcomeDoesNotRunAgain", func(t *testing.T) { testEvictedOutcome(t, o) })
		t.Run("EvictedClaimIsNotTakenOver", func(t *testing.T) { testEvictedClaim(t, o) })
	}
}

// An opHold is a key held by a RunOnceTx that is running fn, its
// transaction open.
type opHold struct {
	release chan struct{}
	done    chan opAnswer
}

// An opAnswer is what a call returned.
type opAnswer struct {
	val string
	err error
}

// hold starts a RunOnceTx of key on s whose fn waits for end, and returns
// once fn runs: the key's record is written, not committed.
func holdInTx(t *testing.T, o Operator, s *idem.Store[string], key string) *opHold {
	t.Helper()
	h := &opHold{release: make(chan struct{}), done: make(chan opAnswer, 1)}
	running := make(chan struct{})
	go func() {
		v, err := o.RunOnceTx(context.Background(), s, key, func(context.Context) (string, error) {
			close(running)
			<-h.release
			return "first", nil
		})
		h.done <- opAnswer{v, err}
	}()
	select {
	case <-running:
	case r := <-h.done:
		t.Fatalf("the holding RunOnceTx returned before its fn ran: %q, %v", r.val, r.err)
	case <-time.After(10 * time.Second):
		t.Fatal("the holding RunOnceTx's fn never ran")
	}
	t.Cleanup(h.end)
	return h
}

// end lets the holding fn return, and waits for its RunOnceTx.
func (h *opHold) end() {
	select {
	case <-h.release:
	default:
		close(h.release)
	}
}

// outlasts waits for longer than three of the server's wait limits, and
// fails the test if call answers before.
func outlasts(t *testing.T, o Operator, call <-chan opAnswer, what string) {
	t.Helper()
	select {
	case r := <-call:
		t.Fatalf("%s answered while the transaction holding its key was open, with its ctx alive (the server cuts waits short after %v): %q, %v", what, o.WaitLimit, r.val, r.err)
	case <-time.After(3 * o.WaitLimit):
	}
}

// newOperatorStore returns a Store over b, closed when the test ends.
func newOperatorStore(t *testing.T, b backend.Backend) *idem.Store[string] {
	s := idem.New[string](idem.Options{Backend: b})
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// limitedWithKey returns a backend from o.WaitLimited, holding an
// expired record of key if old.
func limitedWithKey(t *testing.T, o Operator, key string, old bool) backend.Backend {
	b := o.WaitLimited(t)
	if old {
		claimAndComplete(t, b, key, "old", shortTTL)
		eventually(t, func() bool { _, ok := get(t, b, key); return !ok }, "the outcome expires")
	}
	return b
}

func testDuplicateWaits(t *testing.T, o Operator, old, tx bool) {
	b := limitedWithKey(t, o, "held", old)
	first, second := newOperatorStore(t, b), newOperatorStore(t, b) // two processes
	h := holdInTx(t, o, first, "held")

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var ran atomic.Bool
	fn := func(context.Context) (string, error) { ran.Store(true); return "second", nil }
	dup := make(chan opAnswer, 1)
	go func() {
		var r opAnswer
		if tx {
			r.val, r.err = o.RunOnceTx(ctx, second, "held", fn)
		} else {
			r.val, r.err = second.RunOnce(ctx, "held", nil, fn)
		}
		dup <- r
	}()
	outlasts(t, o, dup, "a duplicate")

	h.end()
	r := <-h.done
	require.NoError(t, r.err, "the holding RunOnceTx")
	require.Equal(t, "first", r.val)
	r = <-dup
	require.NoError(t, r.err, "the duplicate, once the transaction committed")
	assert.Equal(t, "first", r.val, "the duplicate replays the committed outcome")
	assert.False(t, ran.Load(), "the duplicate ran fn again")
}

func testForgetInTx(t *testing.T, o Operator, old bool) {
	b := limitedWithKey(t, o, "held", old)
	h := holdInTx(t, o, newOperatorStore(t, b), "held")

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	forgot := make(chan opAnswer, 1)
	go func() { forgot <- opAnswer{err: b.Forget(ctx, "held", time.Now())} }()
	select {
	case r := <-forgot:
		if r.err != nil {
			require.ErrorIs(t, r.err, idem.ErrInProgress, "a Forget of a key whose transaction is open")
		}
		h.end()
		require.NoError(t, (<-h.done).err)
		return
	case <-time.After(3 * o.WaitLimit): // it waits, as on a server without a limit
	}
	h.end()
	require.NoError(t, (<-h.done).err)
	if err := (<-forgot).err; err != nil {
		require.ErrorIs(t, err, idem.ErrInProgress, "a Forget that waited for a key's transaction")
	}
}

// evictStores returns two Stores over one evicting backend, as two
// processes would have, and a fn that counts its runs.
func evictStores(t *testing.T, o Operator) (b backend.Backend, first, second *idem.Store[string], runs *atomic.Int32, fn func(context.Context) (string, error)) {
	b = o.Evicting(t)
	runs = new(atomic.Int32)
	fn = func(context.Context) (string, error) { runs.Add(1); return "charged", nil }
	return b, newOperatorStore(t, b), newOperatorStore(t, b), runs, fn
}

func testEvictedOutcome(t *testing.T, o Operator) {
	b, first, second, runs, fn := evictStores(t, o)
	ctx := context.Background()
	v1, err1 := first.RunOnce(ctx, "charge", "order", fn)
	o.Evict(t, b, "charge")
	v2, err2 := second.RunOnce(ctx, "charge", "order", fn)
	switch runs.Load() {
	case 0: // the backend refused to work on an evicting server
		assert.Error(t, err1, "no run, yet no error")
		assert.Error(t, err2, "no run, yet no error")
	case 1:
		require.NoError(t, err1)
		assert.Equal(t, "charged", v1)
		if err2 != nil {
			require.False(t, errors.Is(err2, idem.ErrPayloadMismatch), "%v", err2)
		} else {
			assert.Equal(t, "charged", v2, "the second call replays the first outcome")
		}
	default:
		t.Fatalf("one key ran its operation %d times: the server evicted its remembered outcome, and the next call ran it again", runs.Load())
	}
}

func testEvictedClaim(t *testing.T, o Operator) {
	b, first, second, _, _ := evictStores(t, o)
	ctx := context.Background()
	owner, err := first.Begin(ctx, "charge", "order")
	if err != nil {
		return // refused: nothing runs on an evicting server
	}
	defer owner.Release()
	require.False(t, owner.Replayed())
	o.Evict(t, b, "charge")
	dup, err := second.Begin(ctx, "charge", "order")
	if err == nil {
		defer dup.Release()
		assert.True(t, dup.Replayed(), "a second caller claimed a key in flight whose claim the server evicted")
	}
}
