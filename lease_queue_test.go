package idem

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// queued returns the leases in q, head to tail, checking the links both
// ways.
func queued(t *testing.T, q *leaseQueue[int]) []*lease[int] {
	t.Helper()
	q.mu.Lock()
	defer q.mu.Unlock()
	var ls []*lease[int]
	var prev *lease[int]
	for l := q.head; l != nil; l = l.qnext {
		require.Same(t, prev, l.qprev, "a broken back link")
		require.True(t, l.queued)
		ls = append(ls, l)
		prev = l
	}
	require.Same(t, prev, q.tail)
	return ls
}

// stoppedLease is a lease due at next whose fire does nothing: it is
// stopped.
func stoppedLease(next time.Time) *lease[int] { return &lease[int]{next: next, stopped: true} }

// Leases wait in the order their first renewal comes due, whatever order
// they came in: two claims whose replies came back in the other order
// than they were sent.
func TestLeasesQueueInTheOrderTheyComeDue(t *testing.T) {
	var q leaseQueue[int]
	base := time.Now().Add(time.Hour)
	a, b, c, d := stoppedLease(base.Add(3*time.Second)), stoppedLease(base.Add(time.Second)), stoppedLease(base.Add(2*time.Second)), stoppedLease(base)
	for _, l := range []*lease[int]{a, b, c, d} {
		q.add(l)
	}
	assert.Equal(t, []*lease[int]{d, b, c, a}, queued(t, &q))

	q.remove(b) // in the middle
	q.remove(d) // the head
	q.remove(a) // the tail
	q.remove(a) // twice: nothing
	assert.Equal(t, []*lease[int]{c}, queued(t, &q))
	q.remove(c)
	assert.Empty(t, queued(t, &q))
	assert.False(t, q.timer.Stop(), "the timer of an empty queue is still armed")
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
	assert.Equal(t, []*lease[int]{later}, queued(t, &q))
	assert.False(t, due1.queued)
	assert.False(t, due2.queued)
	assert.True(t, q.timer.Stop(), "the timer is not armed for the lease left")
}
