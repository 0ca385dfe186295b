package idem_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/bolt"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/stretchr/testify/require"
)

// Backends that misbehave on purpose, and what the tests of the core need
// to drive and watch them.

// errLost stands for a reply lost on its way back: a broken connection.
var errLost = errors.New("connection reset by peer")

// loseOnce returns a Lose function that loses the reply to op once.
func loseOnce(op string) func(string) error {
	var once sync.Once
	return func(o string) error {
		var err error
		if o == op {
			once.Do(func() { err = errLost })
		}
		return err
	}
}

// retryingClient sends every claim twice, as a client library does when
// the first reply is lost: the second finds the first's record.
type retryingClient struct{ backend.Backend }

func (r retryingClient) Claim(ctx context.Context, rec backend.Record, now time.Time, lease time.Duration) (backend.Record, bool, error) {
	if _, _, err := r.Backend.Claim(ctx, rec, now, lease); err != nil {
		return backend.Record{}, false, err
	}
	return r.Backend.Claim(ctx, rec, now, lease)
}

// hooked wraps a Backend with functions that run around its calls.
type hooked struct {
	backend.Backend
	claim func(ctx context.Context, rec backend.Record, now time.Time, lease time.Duration) (backend.Record, bool, error)
	renew func(ctx context.Context) error
	get   func(ctx context.Context) error
}

func (h hooked) Claim(ctx context.Context, rec backend.Record, now time.Time, lease time.Duration) (backend.Record, bool, error) {
	if h.claim != nil {
		return h.claim(ctx, rec, now, lease)
	}
	return h.Backend.Claim(ctx, rec, now, lease)
}

func (h hooked) Renew(ctx context.Context, key, token string, now time.Time, lease time.Duration) error {
	if h.renew != nil {
		if err := h.renew(ctx); err != nil {
			return err
		}
	}
	return h.Backend.Renew(ctx, key, token, now, lease)
}

func (h hooked) Get(ctx context.Context, key string, now time.Time) (backend.Record, bool, error) {
	if h.get != nil {
		if err := h.get(ctx); err != nil {
			return backend.Record{}, false, err
		}
	}
	return h.Backend.Get(ctx, key, now)
}

// claimLostThenDown is a backend over mem where a claim lands but its
// reply is lost, and from then on every other call fails until down is
// cleared: nobody can tell whether the claim landed.
func claimLostThenDown(mem backend.Backend) (backend.Backend, *atomic.Bool) {
	var down atomic.Bool
	return idemtest.Faulty{Backend: mem,
		Lose: func(op string) error {
			if op == "Claim" {
				down.Store(true)
				return errLost
			}
			return nil
		},
		Fail: func(op string) error {
			if down.Load() && op != "Claim" {
				return errLost
			}
			return nil
		},
	}, &down
}

// waitFor polls cond for up to ten seconds.
func waitFor(t *testing.T, cond func() bool, msg string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out: %s", msg)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func absent(mem *idemtest.MemoryBackend, key string) func() bool {
	return func() bool {
		_, ok, err := mem.Get(context.Background(), key, time.Now())
		return err == nil && !ok
	}
}

// runtimeGC runs a collection, so that a dropped Ticket's finalizer runs.
func runtimeGC() { runtime.GC() }

// fakeClock is an injectable clock that moves only when told to.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Now().UTC().Truncate(time.Second)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// newStore returns a store with opts that is closed when the test ends
// (before a backend whose cleanup was registered first).
func newStore[R any](t *testing.T, opts idem.Options) *idem.Store[R] {
	t.Helper()
	s := idem.New[R](opts)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// runToEnd runs f on a goroutine of its own (f may Goexit) and fails the
// test if it has not ended within a few seconds.
func runToEnd(t *testing.T, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("call did not return")
	}
}

// stepBackends are the Steppers the table tests run on: one in memory, one
// in a file.
var stepBackends = []struct {
	name string
	b    func(t *testing.T) backend.Backend
}{
	{"memory", func(*testing.T) backend.Backend { return idemtest.NewMemoryBackend() }},
	{"bolt", func(t *testing.T) backend.Backend { return openBolt(t) }},
}

// openBolt opens a bolt file closed when the test ends.
func openBolt(t *testing.T) *bolt.Backend {
	t.Helper()
	b, err := bolt.Open(filepath.Join(t.TempDir(), "idem.db"), nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// atRecoveryPoint leaves key at a recovery point: one step "a" recorded
// (returning 1), then an ordinary error.
func atRecoveryPoint(t *testing.T, s *idem.Store[string], key, payload string) {
	t.Helper()
	_, err := s.RunOnce(context.Background(), key, payload, func(ctx context.Context) (string, error) {
		if _, err := idem.Step(ctx, "a", func(context.Context) (int, error) { return 1, nil }); err != nil {
			return "", err
		}
		return "", errors.New("transient: stop at the recovery point")
	})
	require.Error(t, err)
	require.False(t, idem.IsFinal(err))
}

type stepOutcome struct {
	val string
	err error
}

// order is the result type of the durable tests.
type order struct {
	ID     int
	Amount int
}

// durableStore returns a store over b that is closed when the test ends.
func durableStore(t *testing.T, b backend.Backend, opts idem.Options) *idem.Store[order] {
	t.Helper()
	opts.Backend = b
	s := idem.New[order](opts)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func countingFn(v order) (*atomic.Int32, func(context.Context) (order, error)) {
	var calls atomic.Int32
	return &calls, func(context.Context) (order, error) {
		calls.Add(1)
		return v, nil
	}
}

func mustFingerprint(t *testing.T, payload any) idem.Fingerprint {
	t.Helper()
	fp, err := idem.DefaultFingerprint(payload)
	require.NoError(t, err)
	return fp
}

// modeStores returns a store over b with o in each mode a key's owner may
// run in: plain, RetryInterrupted and Resume.
func modeStores(b backend.Backend, o idem.Options) []*idem.Store[string] {
	var stores []*idem.Store[string]
	for _, mode := range []string{"plain", "RetryInterrupted", "Resume"} {
		o.Backend = b
		o.RetryInterrupted = mode == "RetryInterrupted"
		o.Resume = mode == "Resume"
		stores = append(stores, idem.New[string](o))
	}
	return stores
}

// roller returns the Int64N of a rand seeded with seed, safe for the
// goroutines of a test to share.
func roller(seed1, seed2 uint64) func(n int64) int64 {
	var mu sync.Mutex
	rng := rand.New(rand.NewPCG(seed1, seed2))
	return func(n int64) int64 {
		mu.Lock()
		defer mu.Unlock()
		return rng.Int64N(n)
	}
}

// callEach calls call for each of callers callers of each of keys keys
// (k0, k1, ...) on each of stores, each on a goroutine of its own, and
// returns once every call has returned or ended its goroutine.
func callEach(stores []*idem.Store[string], keys, callers int, call func(k int, key string, s *idem.Store[string])) {
	var wg sync.WaitGroup
	for k := range keys {
		key := fmt.Sprintf("k%d", k)
		for _, s := range stores {
			for range callers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					call(k, key, s)
				}()
			}
		}
	}
	wg.Wait()
}

// liveRuns tells whether a run of a key started while another run of it
// went on under a live context.
type liveRuns struct {
	mu         sync.Mutex
	ctxs       map[string][]context.Context
	overlapped atomic.Bool
}

// start notes a run of key under ctx; the func it returns notes its end.
func (l *liveRuns) start(ctx context.Context, key string) (end func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, other := range l.ctxs[key] {
		if other.Err() == nil {
			l.overlapped.Store(true)
		}
	}
	if l.ctxs == nil {
		l.ctxs = map[string][]context.Context{}
	}
	l.ctxs[key] = append(l.ctxs[key], ctx)
	return func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.ctxs[key] = slices.DeleteFunc(l.ctxs[key], func(c context.Context) bool { return c == ctx })
	}
}

// catchEscape calls f and keeps in escaped any panic that leaves it.
func catchEscape(escaped *atomic.Value, f func()) {
	returned := false
	defer func() {
		if !returned {
			if v := recover(); v != nil {
				escaped.Store(fmt.Sprint(v))
			}
		}
	}()
	f()
	returned = true
}

// everyKeyAnswers runs each of keys keys (k0, k1, ...) on s and fails the
// test unless each answers "done <key>" within 10 s: none was left stuck.
func everyKeyAnswers(t *testing.T, s *idem.Store[string], keys int) {
	t.Helper()
	for k := range keys {
		key := fmt.Sprintf("k%d", k)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		v, err := s.RunOnce(ctx, key, "p", func(context.Context) (string, error) { return "done " + key, nil })
		cancel()
		require.NoError(t, err, "key %s was left stuck", key)
		require.Equal(t, "done "+key, v)
	}
}

// ownerRunning starts a RunOnce of key on s whose fn runs until its
// context ends (it honours it), and returns that context once fn runs and
// the channel RunOnce's error comes on.
func ownerRunning(s *idem.Store[string], key string) (context.Context, <-chan error) {
	owner := make(chan context.Context, 1)
	first := make(chan error, 1)
	go func() {
		_, err := s.RunOnce(context.Background(), key, "p", func(ctx context.Context) (string, error) {
			owner <- ctx
			<-ctx.Done()
			return "", context.Cause(ctx)
		})
		first <- err
	}()
	return <-owner, first
}

// takeOver runs key on s, within 10 s, with an fn that answers "second",
// and tells whether that fn started before the owner's context octx ended.
func takeOver(s *idem.Store[string], key string, octx context.Context) (v string, overlapped bool, err error) {
	var early atomic.Bool
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	v, err = s.RunOnce(ctx, key, "p", func(context.Context) (string, error) {
		select {
		case <-octx.Done():
		default:
			early.Store(true)
		}
		return "second", nil
	})
	return v, early.Load(), err
}
