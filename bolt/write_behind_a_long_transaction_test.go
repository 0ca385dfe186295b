package bolt

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	bbolt "go.etcd.io/bbolt"
)

// While an Update (or a RunOnceTx) runs its fn, the committer waits for it,
// and every other write waits for the committer. A write whose ctx ends in
// that wait must give up, refused with nothing written, as a Backend call
// and the RunOnce caller above it end with their ctx. Before, write waited
// for its answer whatever ctx said: a RunOnce with a 100 ms ctx, and a
// Claim, waited for as long as the Update's fn ran (here until the test's
// 5 s bound released it).
func TestWriteBehindALongTransactionEndsWithItsCtx(t *testing.T) {
	b, _ := openTemp(t, nil)
	s := idem.New[int](idem.Options{Backend: b})
	t.Cleanup(func() { _ = s.Close() })

	in, hold := make(chan struct{}), make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(hold) }) }
	t.Cleanup(release)
	timer := time.AfterFunc(5*time.Second, release) // a bound on the test, not an ordering
	defer timer.Stop()
	updated := make(chan error, 1)
	go func() {
		updated <- b.Update(context.Background(), func(*bbolt.Tx) error {
			close(in)
			<-hold
			return nil
		})
	}()
	<-in

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	start := time.Now()
	_, _, err := b.Claim(ctx, backend.Record{Key: "claimed", Token: "t", State: backend.StatePending}, time.Now(), time.Minute)
	cancel()
	assert.Less(t, time.Since(start), 2*time.Second, "Claim waited for the Update's fn, not its ctx")
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.ErrorIs(t, err, backend.ErrRefused, "a write taken back is refused")

	ctx, cancel = context.WithTimeout(context.Background(), 100*time.Millisecond)
	start = time.Now()
	ran := false
	_, err = s.RunOnce(ctx, "run", "p", func(context.Context) (int, error) { ran = true; return 1, nil })
	cancel()
	assert.Less(t, time.Since(start), 2*time.Second, "RunOnce waited for the Update's fn, not its ctx")
	assert.ErrorIs(t, err, context.DeadlineExceeded)

	release()
	require.NoError(t, <-updated)
	_, ok, err := b.Get(context.Background(), "claimed", time.Now())
	require.NoError(t, err)
	assert.False(t, ok, "the refused claim wrote its record")
	// The key the caller left is claimed by nobody: the next call runs.
	v, err := s.RunOnce(context.Background(), "run", "p", func(context.Context) (int, error) { return 2, nil })
	require.NoError(t, err)
	assert.Equal(t, 2, v)
	assert.False(t, ran, "fn ran for a caller whose claim was refused")
}

// The same for an Update queued behind another: its fn never runs once
// its caller has left. Before, Update waited for the first fn whatever its
// ctx said.
func TestUpdateBehindALongTransactionEndsWithItsCtx(t *testing.T) {
	b, _ := openTemp(t, nil)
	in, hold := make(chan struct{}), make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(hold) }) }
	t.Cleanup(release)
	timer := time.AfterFunc(5*time.Second, release) // a bound on the test, not an ordering
	defer timer.Stop()
	updated := make(chan error, 1)
	go func() {
		updated <- b.Update(context.Background(), func(*bbolt.Tx) error {
			close(in)
			<-hold
			return nil
		})
	}()
	<-in

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	ran := false
	err := b.Update(ctx, func(*bbolt.Tx) error { ran = true; return nil })
	assert.Less(t, time.Since(start), 2*time.Second, "Update waited for the first Update's fn, not its ctx")
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.ErrorIs(t, err, backend.ErrRefused)
	release()
	require.NoError(t, <-updated)
	// A write after it goes through the committer that skipped it.
	require.NoError(t, b.Update(context.Background(), func(*bbolt.Tx) error { return nil }))
	assert.False(t, ran, "the fn of an Update whose caller left ran")
}
