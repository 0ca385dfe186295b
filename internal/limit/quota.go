package limit

import (
	"sync"
	"time"
)

// buckets is how finely a Quota's window is cut. A key counts until the
// whole window has passed since the end of the bucket it was counted in:
// for up to window/buckets longer than the window itself, never shorter,
// so the quota errs on the side of refusing. A window keeps slots buckets:
// the current one and the buckets before it.
const (
	buckets = 16
	slots   = buckets + 1
	longest = 100 * 365 * 24 * time.Hour
)

// A Quota counts the keys each scope made within a sliding window and
// refuses a scope past its share. It is safe for concurrent use.
type Quota struct {
	max   int32
	width time.Duration // of one bucket
	now   func() time.Time
	start time.Time // buckets are numbered from it, by the monotonic clock

	mu     sync.Mutex
	scopes map[string]*window // guarded by mu; a scope with nothing counted has no entry
	made   int                // guarded by mu; reservations since the last prune
}

// window is one scope's counts: counts[i] holds the keys counted in bucket
// number n where n%slots == i, for the buckets from head-buckets to head.
type window struct {
	head   int64 // the newest bucket number counted
	total  int32 // the sum of counts
	counts [slots]int32
}

// DefaultWindow is a Quota's window when none is given: the store's
// default TTL.
const DefaultWindow = 24 * time.Hour

// NewQuota returns a Quota of keys per scope within win (zero or negative:
// DefaultWindow), clocked by now (nil: time.Now). Zero or negative keys means no quota: every Reserve
// succeeds and nothing is kept.
func NewQuota(keys int, win time.Duration, now func() time.Time) *Quota {
	if now == nil {
		now = time.Now
	}
	if win <= 0 {
		win = DefaultWindow
	}
	// A century is as long as any window needs (idem's own longest TTL),
	// and keeps the arithmetic on bucket numbers far from overflowing.
	width := max(min(win, longest)/buckets, time.Millisecond)
	return &Quota{max: int32(min(keys, 1<<30)), width: width, now: now, start: now(), scopes: make(map[string]*window)}
}

// A Reservation is one key counted against its scope, to be given back
// with Cancel if the key ends up holding nothing.
type Reservation struct {
	q      *Quota
	scope  string
	bucket int64 // 0: nothing was counted
}

// Reserve counts one more key for scope and reports whether the scope was
// within its quota; if not, nothing is counted.
func (q *Quota) Reserve(scope string) (Reservation, bool) {
	if q == nil || q.max <= 0 {
		return Reservation{}, true
	}
	n := q.bucket()
	q.mu.Lock()
	defer q.mu.Unlock()
	w := q.scopes[scope]
	if w == nil {
		w = &window{head: n}
		q.scopes[scope] = w
	}
	w.advance(n)
	if w.total >= q.max {
		if w.total == 0 {
			delete(q.scopes, scope)
		}
		return Reservation{}, false
	}
	w.counts[n%slots]++
	w.total++
	if q.made++; q.made >= pruneEvery {
		q.prune(n)
	}
	return Reservation{q: q, scope: scope, bucket: n}, true
}

// Cancel gives back a key counted by Reserve, unless its bucket has left
// the window already. It does nothing for a zero Reservation, and is not
// to be called twice.
func (r Reservation) Cancel() {
	if r.q == nil || r.bucket == 0 {
		return
	}
	q := r.q
	n := q.bucket()
	q.mu.Lock()
	defer q.mu.Unlock()
	w := q.scopes[r.scope]
	if w == nil {
		return
	}
	w.advance(n)
	if i := r.bucket % slots; r.bucket >= n-buckets && w.counts[i] > 0 {
		w.counts[i]--
		w.total--
	}
	if w.total == 0 {
		delete(q.scopes, r.scope)
	}
}

// pruneEvery is how many reservations pass between two prunes: the map's
// scan is paid for by that many reservations, and a scope whose window has
// emptied is kept for at most that long.
const pruneEvery = 1024

// prune forgets the scopes with nothing counted any more, so that the map
// holds only the scopes of the last window. q.mu is held.
func (q *Quota) prune(n int64) {
	q.made = 0
	for scope, w := range q.scopes {
		if w.advance(n); w.total == 0 {
			delete(q.scopes, scope)
		}
	}
}

// Scopes returns how many scopes have keys counted, for tests of the
// quota's own memory.
func (q *Quota) Scopes() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.scopes)
}

// RetryAfter returns how long scope waits until its oldest counted key
// leaves the window: the wait to tell a client refused for its quota.
func (q *Quota) RetryAfter(scope string) time.Duration {
	n := q.bucket()
	q.mu.Lock()
	defer q.mu.Unlock()
	w := q.scopes[scope]
	if w == nil {
		return 0
	}
	w.advance(n)
	for b := n - buckets; b <= n; b++ {
		if w.counts[b%slots] > 0 {
			// Bucket b ends at (b-buckets+1) widths from start, and its
			// keys count a whole window after that.
			return time.Duration(b+1)*q.width - q.now().Sub(q.start)
		}
	}
	return 0
}

// bucket returns the number of the bucket that now falls in, counted from
// q.start by the monotonic clock (a stepped wall clock moves nothing), and
// never 0, the zero Reservation's.
func (q *Quota) bucket() int64 {
	return int64(q.now().Sub(q.start)/q.width) + buckets
}

// advance moves the window's head to bucket n, forgetting the buckets that
// leave it. The monotonic clock never goes back, so n is never older than
// the head; if an injected clock does, the head stays and keys counted
// "later" stay counted, the cautious side.
func (w *window) advance(n int64) {
	if n <= w.head {
		return
	}
	if n-w.head >= slots {
		w.counts = [slots]int32{}
		w.total = 0
	} else {
		for b := w.head + 1; b <= n; b++ {
			w.total -= w.counts[b%slots]
			w.counts[b%slots] = 0
		}
	}
	w.head = n
}
