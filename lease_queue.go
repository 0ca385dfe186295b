package idem

import (
	"sync"
	"time"
)

// A leaseQueue holds a store's leases until their first renewal is due, in
// the order it comes due, under one timer: most work ends well before a
// quarter of its lease, and its claim then makes no timer of its own. A
// lease whose first renewal comes due leaves the queue and fires
// (lease.fire), which from then on arms a timer of its own (lease.arm).
//
// A queued lease's next does not change until it leaves the queue: it is
// set by renew, before add, and then only by fire and renewed.
type leaseQueue[R any] struct {
	mu         sync.Mutex
	head, tail *lease[R]   // guarded by mu; linked through lease.qprev and qnext, by next
	timer      *time.Timer // guarded by mu; fires at the head's next (or after it left); made by the first add
}

// add queues l, whose first renewal is due at l.next. Leases come nearly
// in order (each is a claim's send time plus the same quarter lease), so
// its place is found a few steps back from the tail at most.
func (q *leaseQueue[R]) add(l *lease[R]) {
	q.mu.Lock()
	defer q.mu.Unlock()
	p := q.tail
	for p != nil && l.next.Before(p.next) {
		p = p.qprev
	}
	// l goes after p (at the head if p is nil).
	l.queued, l.qprev = true, p
	if p == nil {
		l.qnext, q.head = q.head, l
	} else {
		l.qnext, p.qnext = p.qnext, l
	}
	if l.qnext == nil {
		q.tail = l
	} else {
		l.qnext.qprev = l
	}
	if q.head != l {
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
	if !l.queued {
		return
	}
	if l.qprev == nil {
		q.head = l.qnext
	} else {
		l.qprev.qnext = l.qnext
	}
	if l.qnext == nil {
		q.tail = l.qprev
	} else {
		l.qnext.qprev = l.qprev
	}
	l.queued, l.qprev, l.qnext = false, nil, nil
	if q.head == nil {
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
	for l := q.head; l != nil && !now.Before(l.next); l = q.head {
		q.head = l.qnext
		if q.head == nil {
			q.tail = nil
		} else {
			q.head.qprev = nil
		}
		l.queued, l.qnext = false, nil
		due = append(due, l)
	}
	if q.head != nil {
		q.timer.Reset(time.Until(q.head.next))
	}
	q.mu.Unlock()
	for _, l := range due {
		go l.fire()
	}
}
