package faulttest

import (
	"context"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// skews are the clock errors of the stores in SkewedStores: a minute either
// way of the truth, and the truth.
var skews = []time.Duration{time.Minute, -time.Minute, 0}

// skewedStores returns one store per skew over b, all closed when the test
// ends.
func skewedStores(t *testing.T, b backend.Backend, opts idem.Options) []*idem.Store[int] {
	var stores []*idem.Store[int]
	for _, skew := range skews {
		o := opts
		o.Backend, o.Now = b, func() time.Time { return time.Now().Add(skew) }
		s := idem.New[int](o)
		t.Cleanup(func() { _ = s.Close() })
		stores = append(stores, s)
	}
	return stores
}

// SkewedStores checks that stores whose clocks run a minute fast or slow,
// over one shared backend, still run each key once: a live, renewed lease is
// not taken over, a remembered outcome is not expired early, and a live
// claim cannot be forgotten. The backend must judge time by its server's
// clock. newBackend is called once per subtest and must return an empty
// backend.
func SkewedStores(t *testing.T, newBackend func(t *testing.T) backend.Backend) {
	t.Run("RenewedLeaseHolds", func(t *testing.T) {
		// The owner runs slow by a minute and holds the key across several
		// renewals of a short lease; the others, one a minute fast, keep
		// asking, with RetryInterrupted: none may take it over.
		b := newBackend(t)
		// Long enough that each renewal, bounded by lease/3, lands while
		// two other stores keep the backend busy on a loaded machine.
		const lease = 1200 * time.Millisecond
		stores := skewedStores(t, b, idem.Options{Lease: lease, RetryInterrupted: true})
		owner, others := stores[1], []*idem.Store[int]{stores[0], stores[2]}
		var runs atomic.Int32
		inFn, release := make(chan struct{}), make(chan struct{})
		var releaseOnce sync.Once
		letGo := func() { releaseOnce.Do(func() { close(release) }) }
		defer letGo() // a failed check must not leave fn, and Close, waiting
		result := make(chan error, 1)
		go func() {
			_, err := owner.RunOnce(context.Background(), "k", "p", func(context.Context) (int, error) {
				runs.Add(1)
				close(inFn)
				<-release
				return 1, nil
			})
			result <- err
		}()
		started(t, inFn)
		deadline := time.Now().Add(3 * lease) // three leases: several renewals
		for time.Now().Before(deadline) {
			for _, s := range others {
				ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
				_, err := s.RunOnce(ctx, "k", "p", func(context.Context) (int, error) { runs.Add(1); return 2, nil })
				cancel()
				require.ErrorIs(t, err, idem.ErrInProgress, "a store with a skewed clock must see the renewed lease hold")
			}
		}
		letGo()
		require.NoError(t, <-result)
		for _, s := range others {
			v, err := s.RunOnce(context.Background(), "k", "p", func(context.Context) (int, error) { runs.Add(1); return 2, nil })
			require.NoError(t, err)
			assert.Equal(t, 1, v, "the owner's outcome replays")
		}
		assert.Equal(t, int32(1), runs.Load(), "one execution")
	})

	t.Run("TTLAndForget", func(t *testing.T) {
		// An outcome remembered for 8 s, recorded by the slow store, is
		// replayed by the fast one; a claim held by the slow store cannot
		// be forgotten by the fast one.
		b := newBackend(t)
		stores := skewedStores(t, b, idem.Options{TTL: 8 * time.Second})
		fast, slow := stores[0], stores[1]
		var runs atomic.Int32
		fn := func(context.Context) (int, error) { runs.Add(1); return 7, nil }
		_, err := slow.RunOnce(context.Background(), "done", "p", fn)
		require.NoError(t, err)
		v, err := fast.RunOnce(context.Background(), "done", "p", fn)
		require.NoError(t, err)
		assert.Equal(t, 7, v)
		assert.Equal(t, int32(1), runs.Load(), "a store a minute fast took an 8 s outcome for expired")

		inFn, release := make(chan struct{}), make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			_, _ = slow.RunOnce(context.Background(), "live", "p", func(context.Context) (int, error) {
				close(inFn)
				<-release
				return 1, nil
			})
		}()
		started(t, inFn)
		assert.ErrorIs(t, fast.Forget(context.Background(), "live"), idem.ErrInProgress, "a fast store forgot a live claim")
		close(release)
		<-done
		require.NoError(t, fast.Forget(context.Background(), "live"), "a settled key can be forgotten")
	})

	t.Run("ForeverTTLAndLease", func(t *testing.T) {
		// math.MaxInt64, a common "for ever", must not wrap into the past.
		b := newBackend(t)
		stores := skewedStores(t, b, idem.Options{TTL: math.MaxInt64, Lease: math.MaxInt64})
		var runs atomic.Int32
		for _, s := range stores {
			v, err := s.RunOnce(context.Background(), "k", "p", func(context.Context) (int, error) { runs.Add(1); return 9, nil })
			require.NoError(t, err)
			assert.Equal(t, 9, v)
		}
		assert.Equal(t, int32(1), runs.Load(), "an outcome kept for ever expired at once")
	})

	t.Run("OneExecutionPerKey", func(t *testing.T) {
		// Every store asks for every key at once, many times.
		b := newBackend(t)
		stores := skewedStores(t, b, idem.Options{Lease: time.Second})
		const keys, rounds = 100, 3
		var mu sync.Mutex
		runs := map[string]int{}
		start := make(chan struct{})
		var wg sync.WaitGroup
		for _, s := range stores {
			for range rounds {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					for k := range keys {
						key := fmt.Sprint("k", k)
						_, err := s.RunOnce(context.Background(), key, "p", func(context.Context) (int, error) {
							mu.Lock()
							runs[key]++
							mu.Unlock()
							return k, nil
						})
						assert.NoError(t, err)
					}
				}()
			}
		}
		close(start)
		wg.Wait()
		assert.Len(t, runs, keys)
		for key, n := range runs {
			assert.Equal(t, 1, n, "key %s ran %d times", key, n)
		}
	})
}

// started waits for fn to signal that it runs, for at most ten seconds.
func started(t *testing.T, inFn <-chan struct{}) {
	t.Helper()
	select {
	case <-inFn:
	case <-time.After(10 * time.Second):
		t.Fatal("fn never started")
	}
}
