package idem

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// counter returns an fn that counts its calls and returns the count.
func counter() (*atomic.Int32, func(context.Context) (int, error)) {
	var calls atomic.Int32
	return &calls, func(context.Context) (int, error) { return int(calls.Add(1)), nil }
}

func TestTTLReplaysUntilExpiry(t *testing.T) {
	clock := newFakeClock()
	s := newStore[int](t, Options{TTL: time.Hour, Now: clock.Now, SweepInterval: -1})
	calls, fn := counter()
	ctx := context.Background()

	v, err := s.RunOnce(ctx, "k", "p", fn)
	require.NoError(t, err)
	require.Equal(t, 1, v)

	clock.Advance(time.Hour - time.Nanosecond)
	v, err = s.RunOnce(ctx, "k", "p", fn)
	require.NoError(t, err)
	assert.Equal(t, 1, v, "replays until the TTL has passed")

	clock.Advance(time.Nanosecond)
	v, err = s.RunOnce(ctx, "k", "p", fn)
	require.NoError(t, err)
	assert.Equal(t, 2, v, "executes again once expired, without waiting for a sweep")
	assert.Equal(t, int32(2), calls.Load())

	// An expired key takes a new payload too: it is a new operation.
	clock.Advance(time.Hour)
	v, err = s.RunOnce(ctx, "k", "another payload", fn)
	require.NoError(t, err)
	assert.Equal(t, 3, v)
}

func TestSweepRemovesExpired(t *testing.T) {
	clock := newFakeClock()
	s := newStore[int](t, Options{TTL: time.Minute, Now: clock.Now, SweepInterval: -1})
	_, fn := counter()
	ctx := context.Background()
	const early, late = 20_000, 300 // hundreds per shard: several sweep batches
	for i := range early {
		_, err := s.RunOnce(ctx, fmt.Sprint("early-", i), nil, fn)
		require.NoError(t, err)
	}
	clock.Advance(30 * time.Second)
	for i := range late {
		_, err := s.RunOnce(ctx, fmt.Sprint("late-", i), nil, fn)
		require.NoError(t, err)
	}
	require.NoError(t, s.Forget(ctx, "late-0")) // forgotten entries leave the expiry order too

	n, err := s.Sweep(ctx)
	require.NoError(t, err)
	assert.Equal(t, 0, n, "nothing has expired yet")

	clock.Advance(30 * time.Second)
	n, err = s.Sweep(ctx)
	require.NoError(t, err)
	assert.Equal(t, early, n)
	assert.Equal(t, late-1, s.Len())

	clock.Advance(30 * time.Second)
	n, err = s.Sweep(ctx)
	require.NoError(t, err)
	assert.Equal(t, late-1, n)
	assert.Equal(t, 0, s.Len())
}

func TestSweepStopsWithContext(t *testing.T) {
	clock := newFakeClock()
	s := newStore[int](t, Options{TTL: time.Minute, Now: clock.Now, SweepInterval: -1})
	_, fn := counter()
	for i := range 100 {
		_, err := s.RunOnce(context.Background(), fmt.Sprint(i), nil, fn)
		require.NoError(t, err)
	}
	clock.Advance(time.Hour)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := s.Sweep(ctx)
	assert.ErrorIs(t, err, context.Canceled)
	assert.Equal(t, 100, s.Len())
}

// A steady stream of new keys, swept as the background sweeper would, keeps
// memory bounded by arrival rate x (TTL + sweep interval).
func TestSteadyLoadStaysBounded(t *testing.T) {
	const (
		keys     = 50_000
		every    = time.Millisecond // one new key per millisecond
		ttl      = time.Second      // so about 1,000 keys live at once
		interval = 100 * time.Millisecond
	)
	clock := newFakeClock()
	s := newStore[int](t, Options{TTL: ttl, Now: clock.Now, SweepInterval: -1})
	_, fn := counter()
	ctx := context.Background()
	bound := int((ttl + interval) / every)
	maxLen := 0
	for i := range keys {
		_, err := s.RunOnce(ctx, fmt.Sprintf("key-%06d", i), nil, fn)
		require.NoError(t, err)
		clock.Advance(every)
		if i%int(interval/every) == 0 {
			_, err := s.Sweep(ctx)
			require.NoError(t, err)
		}
		maxLen = max(maxLen, s.Len())
	}
	assert.LessOrEqual(t, maxLen, bound)
	assert.GreaterOrEqual(t, maxLen, int(ttl/every), "entries must be kept for the whole TTL")
}

// captureHandler is a slog.Handler that sends each record's message to a
// channel.
type captureHandler struct{ msgs chan string }

func (h captureHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h captureHandler) Handle(_ context.Context, r slog.Record) error {
	select {
	case h.msgs <- r.Message:
	default:
	}
	return nil
}
func (h captureHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h captureHandler) WithGroup(string) slog.Handler      { return h }

func TestSweeperSurvivesPanic(t *testing.T) {
	var batches atomic.Int64
	testHookSweepBatch = func() {
		if batches.Add(1) == 1 {
			panic("sweep bug")
		}
	}
	defer func() { testHookSweepBatch = nil }()

	clock := newFakeClock()
	reads := make(chan time.Time) // unbuffered: a read is reported only while the test listens
	logs := captureHandler{msgs: make(chan string, 10)}
	s := New[int](Options{
		TTL:           time.Minute,
		SweepInterval: time.Millisecond,
		Now: func() time.Time {
			now := clock.Now()
			select {
			case reads <- now:
			default:
			}
			return now
		},
		Logger: slog.New(logs),
	})
	defer s.Close()
	_, fn := counter()
	_, err := s.RunOnce(context.Background(), "k", nil, fn)
	require.NoError(t, err)

	assert.Contains(t, <-logs.msgs, "sweep panicked")
	clock.Advance(time.Hour)
	expired := clock.Now()
	// Each sweep reads the clock once, as it starts. Wait for a sweep that
	// read the new time, then for the next read, which proves it ended.
	for now := range reads {
		if !now.Before(expired) {
			break
		}
	}
	<-reads
	assert.Equal(t, 0, s.Len(), "the sweeper stopped after a panic")
	require.NoError(t, s.Close())
}

// Two executions may read the clock in one order and record their outcomes in
// the other; the expiry list must stay in expiry order all the same, or a
// sweep would stop at a live head with expired entries behind it.
func TestExpiryOrderSurvivesOutOfOrderCompletion(t *testing.T) {
	tb := newTable[int](0)
	now := newFakeClock().Now()
	// Two keys on one shard.
	a := "a"
	b := ""
	for i := 0; b == ""; i++ {
		if k := fmt.Sprint("b", i); tb.shard(k) == tb.shard(a) {
			b = k
		}
	}
	ea, _, err := tb.claim(a, Fingerprint{}, now, false, false)
	require.NoError(t, err)
	eb, _, err := tb.claim(b, Fingerprint{}, now, false, false)
	require.NoError(t, err)
	tb.complete(eb, now.Add(2*time.Second)) // b read the clock later but recorded first
	tb.complete(ea, now.Add(time.Second))

	n, err := tb.sweep(now.Add(2*time.Second), noStop)
	require.NoError(t, err)
	assert.Equal(t, 2, n, "an entry sorted behind a live one was left unswept")
}

// A clock stepped forward and back (an NTP step: time.Now().UTC() carries
// no monotonic reading) shortens or extends no other key's TTL: a key
// completed after the step expires on time, and a sweep removes it
// (issue 18: each expiry was raised to the shard's latest, so a 1-minute
// key replayed for 10 hours).
func TestClockStepExtendsNoTTL(t *testing.T) {
	clock := newFakeClock()
	s := newStore[int](t, Options{TTL: time.Minute, Now: clock.Now, SweepInterval: -1})
	runs := 0
	fn := func(context.Context) (int, error) { runs++; return runs, nil }
	ctx := context.Background()
	clock.Advance(10 * time.Hour)
	for i := range numShards * 4 { // enough keys to meet "k" in its shard
		_, err := s.RunOnce(ctx, fmt.Sprint("ahead-", i), nil, fn)
		require.NoError(t, err)
	}
	clock.Advance(-10 * time.Hour)
	_, err := s.RunOnce(ctx, "k", nil, fn)
	require.NoError(t, err)
	before := runs

	clock.Advance(2 * time.Minute)
	v, err := s.RunOnce(ctx, "k", nil, fn)
	require.NoError(t, err)
	assert.Equal(t, before+1, v, "the key replayed past its TTL")

	clock.Advance(2 * time.Minute)
	n, err := s.Sweep(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, n, "the sweep left the expired key behind the keys completed ahead of the step")
	assert.Equal(t, numShards*4, s.Len())
	clock.Advance(10 * time.Hour)
	n, err = s.Sweep(ctx)
	require.NoError(t, err)
	assert.Equal(t, numShards*4, n)
	assert.Equal(t, 0, s.Len())
}

// Completions that reach a shard out of their clock order (two executions
// that read the clock in one order and took the lock in the other, or a
// clock that keeps stepping back and forth) each expire at their own
// instant, and sweeps remove exactly the expired ones.
func TestExpiryOrderUnderASteppingClock(t *testing.T) {
	clock := newFakeClock()
	s := newStore[int](t, Options{TTL: time.Hour, Now: clock.Now, SweepInterval: -1})
	ctx := context.Background()
	base := clock.Now()
	expiries := map[string]time.Time{}
	for i := range 400 {
		// A clock that wanders up to ±30 minutes, many times over.
		d := time.Duration((i*7919)%61-30) * time.Minute
		clock.Advance(base.Add(d).Sub(clock.Now()))
		k := fmt.Sprint("k", i)
		_, err := s.RunOnce(ctx, k, nil, func(context.Context) (int, error) { return i, nil })
		require.NoError(t, err)
		expiries[k] = clock.Now().Add(time.Hour)
	}
	for step := -30; step <= 31; step++ {
		at := base.Add(time.Hour + time.Duration(step)*time.Minute)
		clock.Advance(at.Sub(clock.Now()))
		_, err := s.Sweep(ctx)
		require.NoError(t, err)
		left := 0
		for _, exp := range expiries {
			if at.Before(exp) {
				left++
			}
		}
		require.Equal(t, left, s.Len(), "at %v", step)
	}
}

// After a shard holds runsTried expiry runs (eight backward clock steps
// within one TTL: a VM with a bad clock source, NTP stepping a drifting
// host), a completion whose expiry falls before every run's recent entries
// starts a run of its own. It used to be inserted with an unbounded walk
// from the last run's tail, under the shard's lock: after one more step
// back, every completion walked past every entry completed while the clock
// was ahead, O(n) in the shard's size (1000 completions
// took 130 ms against 2 ms). Checked by the shape it leaves, not by
// timing: the step back's completions are a new run, and every entry
// still expires at its own instant.
func TestCompletionAfterClockStepsStartsItsOwnExpiryRun(t *testing.T) {
	clock := newFakeClock()
	s := newStore[int](t, Options{TTL: time.Minute, Now: clock.Now, SweepInterval: -1})
	target := s.table.shard("seed")
	n := 0
	keys := func(count int) []string { // keys of target's shard, fresh each call
		out := make([]string, 0, count)
		for len(out) < count {
			n++
			k := "k" + strconv.Itoa(n)
			if s.table.shard(k) == target {
				out = append(out, k)
			}
		}
		return out
	}
	complete := func(ks []string) time.Duration {
		start := time.Now()
		for _, k := range ks {
			if _, err := s.RunOnce(context.Background(), k, "p", func(context.Context) (int, error) { return 1, nil }); err != nil {
				t.Fatal(err)
			}
		}
		return time.Since(start)
	}
	base := clock.Now()
	at := func(d time.Duration) { clock.mu.Lock(); clock.now = base.Add(d); clock.mu.Unlock() }

	// Eight runs: each step back finds more than runWalk later entries.
	for i := runsTried + 1; i > 1; i-- {
		at(time.Duration(i) * time.Hour)
		complete(keys(runWalk + 2))
	}
	if got := len(target.runs); got != runsTried {
		t.Fatalf("setup: %d runs, want %d", got, runsTried)
	}
	// The clock ahead: completions at the last run's tail.
	at(20 * time.Hour)
	complete(keys(300))
	at(21 * time.Hour)
	complete(keys(10))
	if got := len(target.runs); got != runsTried {
		t.Fatalf("completions in order started a run: %d runs", got)
	}
	at(1 * time.Hour) // one more step back
	back := keys(10)
	complete(back)
	if got := len(target.runs); got != runsTried+1 {
		t.Fatalf("after a step back past every run: %d runs, want a new one (%d)", got, runsTried+1)
	}
	last := target.runs[len(target.runs)-1]
	if last.head == nil || last.head.key != back[0] || last.tail.key != back[len(back)-1] {
		t.Fatal("the step back's completions are not the new run")
	}
	// The step back's keys expire at their own instant, a TTL after it.
	at(1*time.Hour + 2*time.Minute)
	removed, err := s.Sweep(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if removed < len(back) {
		t.Fatalf("a sweep past the step back's TTL removed %d, want at least %d", removed, len(back))
	}
}
