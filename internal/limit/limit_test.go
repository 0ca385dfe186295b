package limit

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// clock is a fake clock the test moves.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

func TestQuotaRefusesOnlyTheScopeOverItsShare(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	q := NewQuota(3, time.Hour, c.now)
	for range 3 {
		_, ok := q.Reserve("a")
		require.True(t, ok)
	}
	_, ok := q.Reserve("a")
	require.False(t, ok, "a fourth key of scope a")
	_, ok = q.Reserve("b")
	require.True(t, ok, "scope b is untouched by a's")
	require.Positive(t, q.RetryAfter("a"))
	require.LessOrEqual(t, q.RetryAfter("a"), time.Hour+time.Hour/buckets)
}

func TestQuotaCancelGivesTheKeyBack(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	q := NewQuota(1, time.Hour, c.now)
	r, ok := q.Reserve("a")
	require.True(t, ok)
	r.Cancel()
	require.Zero(t, q.Scopes(), "nothing counted, nothing kept")
	_, ok = q.Reserve("a")
	require.True(t, ok)
}

func TestQuotaWindowSlides(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	q := NewQuota(2, time.Hour, c.now)
	old, _ := q.Reserve("a")
	c.add(30 * time.Minute)
	_, ok := q.Reserve("a")
	require.True(t, ok)
	_, ok = q.Reserve("a")
	require.False(t, ok)
	c.add(31*time.Minute + time.Hour/buckets) // the first key has left the window
	_, ok = q.Reserve("a")
	require.True(t, ok)
	old.Cancel() // its bucket is gone: nothing to give back, and no count below zero
	_, ok = q.Reserve("a")
	require.False(t, ok, "the second and third keys are still counted")
	c.add(3 * time.Hour)
	_, ok = q.Reserve("a")
	require.True(t, ok)
}

func TestQuotaPrunesScopesWhoseWindowEmptied(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	q := NewQuota(1, time.Minute, c.now)
	for i := range 5000 {
		q.Reserve(fmt.Sprint("scope-", i))
	}
	c.add(2 * time.Minute)
	for range pruneEvery {
		r, _ := q.Reserve("live")
		r.Cancel()
	}
	require.LessOrEqual(t, q.Scopes(), 1, "scopes of an old window are forgotten")
}

func TestQuotaZeroMeansNone(t *testing.T) {
	q := NewQuota(0, time.Hour, nil)
	for range 100 {
		r, ok := q.Reserve("a")
		require.True(t, ok)
		r.Cancel()
	}
	require.Zero(t, q.Scopes())
}

func TestQuotaUnderRace(t *testing.T) {
	q := NewQuota(50, time.Hour, nil)
	var mu sync.Mutex
	granted := 0
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for range 20 {
				if _, ok := q.Reserve("a"); ok {
					mu.Lock()
					granted++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	require.Equal(t, 50, granted)
}

func TestWaitersCapPerKey(t *testing.T) {
	w := NewWaiters(2)
	for range 3 {
		require.True(t, w.Enter("k")) // the one that runs, and two waiting
	}
	require.False(t, w.Enter("k"))
	require.True(t, w.Enter("other"))
	w.Leave("k")
	require.True(t, w.Enter("k"))
	for range 3 {
		w.Leave("k")
	}
	w.Leave("other")
	require.Zero(t, w.Keys())
}

// A key counts for its whole window, however late in its bucket it was
// made.
func TestQuotaKeyCountsItsWholeWindow(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	win := 16 * time.Minute // one-minute buckets
	q := NewQuota(1, win, c.now)
	c.add(59 * time.Second) // late in its bucket
	_, ok := q.Reserve("a")
	require.True(t, ok)
	c.add(15*time.Minute + 2*time.Second)
	_, ok = q.Reserve("a")
	require.False(t, ok, "the key was made 15m02s ago, inside its 16m window")
	require.Positive(t, q.RetryAfter("a"))
	require.LessOrEqual(t, q.RetryAfter("a"), time.Minute)
	c.add(q.RetryAfter("a"))
	_, ok = q.Reserve("a")
	require.True(t, ok, "RetryAfter is when the key leaves the window")
}
