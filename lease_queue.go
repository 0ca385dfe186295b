package idem

import (
	"sync"
	"time"
)

// A leaseQueue holds a store's leases until their first renewal is due,
// under one timer: most work ends well before a quarter of its lease, and
// its claim then makes no timer of its own. A lease whose first renewal
// comes due leaves the queue and fires (lease.fire), which from then on
// arms a timer of its own (lease.arm).
//
// The leases are a binary min-heap by next, so that claims whose replies
// come back in any order cost a logarithm each, under the queue's lock. A
// queued lease's next does not change until it leaves the queue: it is
// set by renew, before add, and then only by fire and renewed.
type leaseQueue[R any] struct {
	mu    sync.Mutex
	heap  []*lease[R] // guarded by mu; heap[0] comes due first; each lease's qidx is its index
	timer *time.Timer // guarded by mu; fires at heap[0]'s next (or after it left); made by the first add
}

// add queues l, whose first renewal is due at l.next.
func (q *leaseQueue[R]) add(l *lease[R]) {
	q.mu.Lock()
	defer q.mu.Unlock()
	l.qidx = len(q.heap)
	q.heap = append(q.heap, l)
	q.up(l.qidx)
	if q.heap[0] != l {
		return // the timer is armed for an earlier lease
	}
	d := time.Until(l.next)
	if q.timer == nil {
		q.timer = time.AfterFunc(d, q.fire)
	} else {
		q.timer.Reset(d)
	}
}

// remove takes l out of the queue, if it is still there. A timer armed
// for it fires, finds nothing due, and is armed for the next.
func (q *leaseQueue[R]) remove(l *lease[R]) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if l.qidx < 0 || l.qidx >= len(q.heap) || q.heap[l.qidx] != l {
		return // not queued: fired, or never added
	}
	q.take(l.qidx)
	if len(q.heap) == 0 {
		q.timer.Stop() // nothing left to fire for: a closed store's timer holds nothing up
	}
}

// fire runs on the timer's goroutine: it takes the leases whose first
// renewal is due out of the queue, fires each on a goroutine of its own
// (a renewal waits on the Backend), and arms the timer for the next.
func (q *leaseQueue[R]) fire() {
	q.mu.Lock()
	now := time.Now()
	var due []*lease[R]
	for len(q.heap) > 0 && !now.Before(q.heap[0].next) {
		due = append(due, q.take(0))
	}
	if len(q.heap) > 0 {
		q.timer.Reset(time.Until(q.heap[0].next))
	}
	q.mu.Unlock()
	for _, l := range due {
		go l.fire()
	}
}

// take removes and returns the lease at index i. q.mu is held.
func (q *leaseQueue[R]) take(i int) *lease[R] {
	l := q.heap[i]
	last := len(q.heap) - 1
	if i != last {
		q.swap(i, last)
	}
	q.heap[last] = nil
	q.heap = q.heap[:last]
	if i != last {
		q.down(i)
		q.up(i)
	}
	l.qidx = -1
	return l
}

func (q *leaseQueue[R]) less(i, j int) bool { return q.heap[i].next.Before(q.heap[j].next) }

func (q *leaseQueue[R]) swap(i, j int) {
	q.heap[i], q.heap[j] = q.heap[j], q.heap[i]
	q.heap[i].qidx, q.heap[j].qidx = i, j
}

func (q *leaseQueue[R]) up(i int) {
	for i > 0 {
		parent := (i - 1) / 2
		if !q.less(i, parent) {
			return
		}
		q.swap(i, parent)
		i = parent
	}
}

func (q *leaseQueue[R]) down(i int) {
	n := len(q.heap)
	for {
		least := i
		if l := 2*i + 1; l < n && q.less(l, least) {
			least = l
		}
		if r := 2*i + 2; r < n && q.less(r, least) {
			least = r
		}
		if least == i {
			return
		}
		q.swap(i, least)
		i = least
	}
}
