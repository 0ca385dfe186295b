package idem

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// inOrder returns the leases in q in the order they come due, checking
// the heap's order and every lease's index in it; q is left as it was.
func inOrder(t *testing.T, q *leaseQueue[int]) []*lease[int] {
	t.Helper()
	q.mu.Lock()
	defer q.mu.Unlock()
	for i, l := range q.heap {
		require.Equal(t, i, l.qidx, "a lease that does not know its place")
		if i > 0 {
			require.False(t, q.less(i, (i-1)/2), "a lease due before its parent")
		}
	}
	saved := append([]*lease[int](nil), q.heap...)
	var ls []*lease[int]
	for len(q.heap) > 0 {
		ls = append(ls, q.take(0))
	}
	q.heap = saved
	for i, l := range q.heap {
		l.qidx = i
	}
	return ls
}

// stoppedLease is a lease due at next whose fire does nothing: it is
// stopped.
func stoppedLease(next time.Time) *lease[int] { return &lease[int]{next: next, stopped: true} }

// Leases wait in the order their first renewal comes due, whatever order
// they came in: claims whose replies came back in another order than they
// were sent.
func TestLeasesQueueInTheOrderTheyComeDue(t *testing.T) {
	var q leaseQueue[int]
	base := time.Now().Add(time.Hour)
	a, b, c, d := stoppedLease(base.Add(3*time.Second)), stoppedLease(base.Add(time.Second)), stoppedLease(base.Add(2*time.Second)), stoppedLease(base)
	for _, l := range []*lease[int]{a, b, c, d} {
		q.add(l)
	}
	assert.Equal(t, []*lease[int]{d, b, c, a}, inOrder(t, &q))

	q.remove(b) // in the middle
	q.remove(d) // the first
	q.remove(a) // the last
	q.remove(a) // twice: nothing
	assert.Equal(t, []*lease[int]{c}, inOrder(t, &q))
	q.remove(c)
	assert.Empty(t, inOrder(t, &q))
	assert.False(t, q.timer.Stop(), "the timer of an empty queue is still armed")
	q.remove(stoppedLease(base)) // never added: nothing
}

// Many leases added in a random order, some removed: the queue keeps
// them in order, each add and remove a logarithm of the queue's length
// (a queue kept as a list, searched back from its tail, took 2 s for
// 30,000 claims whose replies came back shuffled).
func TestManyLeasesInAnyOrderStayInOrder(t *testing.T) {
	var q leaseQueue[int]
	base := time.Now().Add(time.Hour)
	const n = 30000
	ls := make([]*lease[int], n)
	for i := range ls {
		ls[i] = stoppedLease(base.Add(time.Duration(i) * time.Millisecond))
	}
	rng := rand.New(rand.NewPCG(1, 2))
	rng.Shuffle(n, func(i, j int) { ls[i], ls[j] = ls[j], ls[i] })
	for _, l := range ls {
		q.add(l)
	}
	for _, l := range ls[:n/2] {
		q.remove(l)
	}
	got := inOrder(t, &q)
	require.Len(t, got, n/2)
	for i := 1; i < len(got); i++ {
		require.False(t, got[i].next.Before(got[i-1].next), "out of order at %d", i)
	}
}

// The queue's timer takes out the leases that are due, and only those,
// and is armed for the next.
func TestTheQueueFiresTheLeasesThatAreDue(t *testing.T) {
	var q leaseQueue[int]
	now := time.Now()
	due1, due2, later := stoppedLease(now.Add(-time.Second)), stoppedLease(now), stoppedLease(now.Add(time.Hour))
	q.add(later)
	q.add(due2)
	q.add(due1)
	q.fire()
	assert.Equal(t, []*lease[int]{later}, inOrder(t, &q))
	assert.Equal(t, -1, due1.qidx)
	assert.Equal(t, -1, due2.qidx)
	assert.True(t, q.timer.Stop(), "the timer is not armed for the lease left")
}
