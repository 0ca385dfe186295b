package waitctx

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// made reports whether c has made its context (and timer).
func isMade(c *Ctx) bool { return c.inner.Load() != nil }

type valueKey struct{}

// A wait that is never waited on makes no context: its deadline, values
// and Err are read without one, and Stop ends it.
func TestAWaitNobodyWaitsOnMakesNoTimer(t *testing.T) {
	parent := context.WithValue(context.Background(), valueKey{}, "v")
	before := time.Now()
	c := WithTimeout(parent, time.Hour)
	deadline, ok := c.Deadline()
	assert.True(t, ok)
	assert.WithinRange(t, deadline, before.Add(time.Hour), time.Now().Add(time.Hour))
	assert.Equal(t, "v", c.Value(valueKey{}))
	assert.NoError(t, c.Err())
	assert.NoError(t, context.Cause(c))
	assert.False(t, isMade(c), "reading the deadline, a value or Err made the timer")

	c.Stop()
	assert.ErrorIs(t, c.Err(), context.Canceled)
	assert.ErrorIs(t, context.Cause(c), context.Canceled)
	select {
	case <-c.Done():
	default:
		t.Fatal("Done is open after Stop")
	}
}

// The parent's earlier deadline is the wait's.
func TestTheParentsEarlierDeadlineIsTheWaits(t *testing.T) {
	want := time.Now().Add(time.Minute)
	parent, cancel := context.WithDeadline(context.Background(), want)
	defer cancel()
	c := WithTimeout(parent, time.Hour)
	defer c.Stop()
	got, ok := c.Deadline()
	assert.True(t, ok)
	assert.Equal(t, want, got)
}

// A parent whose deadline comes first ends the wait, and the wait never
// ends before it: a timer of the wait's own at the same instant could
// fire first, and a caller would then see its wait end while its own
// context had not (idemgrpc answers each differently).
func TestAWaitNeverEndsBeforeAParentWhoseDeadlineComesFirst(t *testing.T) {
	for range 20 {
		parent, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
		c := WithTimeout(parent, time.Hour)
		<-c.Done()
		assert.ErrorIs(t, parent.Err(), context.DeadlineExceeded, "the wait ended before its parent")
		c.Stop()
		cancel()
	}
}

// A deadline that has passed is seen by Err without a Done, and then Done,
// Err and Cause agree, as context.WithTimeout's would.
func TestAPassedDeadlineIsSeenWithoutWaiting(t *testing.T) {
	c := WithTimeout(context.Background(), -time.Second)
	defer c.Stop()
	assert.ErrorIs(t, c.Err(), context.DeadlineExceeded)
	assert.ErrorIs(t, context.Cause(c), context.DeadlineExceeded)
	<-c.Done()
}

// Done closes when the time runs out.
func TestDoneClosesWhenTheTimeRunsOut(t *testing.T) {
	c := WithTimeout(context.Background(), 20*time.Millisecond)
	defer c.Stop()
	<-c.Done() // the test's own timeout bounds a timer that never fires
	assert.ErrorIs(t, c.Err(), context.DeadlineExceeded)
}

// The parent's end is the wait's, whether or not the wait was made before.
func TestTheParentsEndEndsTheWait(t *testing.T) {
	for _, waitedFirst := range []bool{false, true} {
		cause := errors.New("client went away")
		parent, cancel := context.WithCancelCause(context.Background())
		c := WithTimeout(parent, time.Hour)
		if waitedFirst {
			_ = c.Done()
		}
		cancel(cause)
		<-c.Done()
		assert.ErrorIs(t, c.Err(), context.Canceled)
		assert.ErrorIs(t, context.Cause(c), cause)
		c.Stop()
	}
}

// Stop after the wait was made ends it too, and stops its timer.
func TestStopEndsAWaitThatWasMade(t *testing.T) {
	c := WithTimeout(context.Background(), time.Hour)
	done := c.Done()
	c.Stop()
	<-done
	assert.ErrorIs(t, c.Err(), context.Canceled)
}

// A child context, or an AfterFunc, under a wait is tied to it by the
// context package as to any of its own: no goroutine a child.
func TestChildrenOfAWaitNeedNoGoroutine(t *testing.T) {
	parent, cancelParent := context.WithCancel(context.Background()) // a parent that can end, as a request's
	defer cancelParent()
	c := WithTimeout(parent, time.Hour)
	const n = 200
	before := runtime.NumGoroutine()
	children := make([]context.Context, n)
	for i := range children {
		var cancel context.CancelFunc
		children[i], cancel = context.WithCancel(c)
		defer cancel()
	}
	fired := make(chan struct{}, n)
	for range n {
		defer context.AfterFunc(c, func() { fired <- struct{}{} })()
	}
	assert.Less(t, runtime.NumGoroutine()-before, n/2, "a goroutine a child")
	c.Stop()
	for _, child := range children {
		<-child.Done()
		assert.ErrorIs(t, child.Err(), context.Canceled)
	}
	for range n {
		<-fired
	}
}

// Many goroutines asking and stopping at once (run with -race).
func TestAWaitIsSafeForConcurrentUse(t *testing.T) {
	for range 50 {
		c := WithTimeout(context.Background(), time.Hour)
		var wg sync.WaitGroup
		for i := range 8 {
			wg.Go(func() {
				switch i % 4 {
				case 0:
					<-c.Done()
				case 1:
					for c.Err() == nil {
						runtime.Gosched()
					}
				case 2:
					_ = c.Value(valueKey{})
					<-c.Done()
				default:
					c.Stop()
				}
			})
		}
		wg.Wait()
		assert.ErrorIs(t, c.Err(), context.Canceled)
	}
}

// The point of it: a wait nobody waits on costs one allocation, where
// context.WithTimeout costs four.
func TestAWaitNobodyWaitsOnAllocatesOnce(t *testing.T) {
	parent, cancel := context.WithCancel(context.Background())
	defer cancel()
	allocs := testing.AllocsPerRun(100, func() {
		c := WithTimeout(parent, time.Minute)
		_ = c.Err()
		c.Stop()
	})
	require.LessOrEqual(t, allocs, 1.0)
}
