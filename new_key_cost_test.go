package idem

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// newKeyAllocs is how many allocations a RunOnce on a new key makes in the
// memory store, on average over runs calls, once the table is warm.
func newKeyAllocs(t *testing.T, ctx context.Context, runs int) float64 {
	s := newStore[receipt](t, Options{MaxKeys: -1})
	var payload any = []byte(strings.Repeat("p", 100))
	fn := func(context.Context) (receipt, error) { return receipt{1, 450}, nil }
	// Enough keys first that the shards' maps seldom grow during the runs.
	const warm = 4096
	keys := make([]string, warm+runs+1)
	for i := range keys {
		keys[i] = fmt.Sprintf("key-%06d", i)
	}
	for _, k := range keys[:warm] {
		_, err := s.RunOnce(ctx, k, payload, fn)
		require.NoError(t, err)
	}
	next := warm
	return testing.AllocsPerRun(runs, func() {
		if _, err := s.RunOnce(ctx, keys[next], payload, fn); err != nil {
			t.Error(err)
		}
		next++
	})
}

// A new key's execution context carries its operation in the operation's
// own allocation: the entry and the operation are all a caller whose ctx
// cannot end pays for.
func TestNewKeyAllocatesEntryAndOperationOnly(t *testing.T) {
	assert.LessOrEqual(t, newKeyAllocs(t, context.Background(), 200), 2.0)
}

// A caller that can leave pays, besides, for the channel it waits on, the
// ticket the detached execution finishes and that goroutine's start.
func TestNewKeyWithCancellableContextAllocatesFive(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	assert.LessOrEqual(t, newKeyAllocs(t, ctx, 200), 5.0)
}

// fn's context, which carries the operation, keeps the caller's values
// and the execution timeout's deadline, and Step and OperationKey find the
// operation through a context made from it.
func TestExecutionContextKeepsValuesDeadlineAndOperation(t *testing.T) {
	s := newStore[receipt](t, Options{ExecutionTimeout: time.Hour})
	type valueKey struct{}
	ctx := context.WithValue(context.Background(), valueKey{}, "v")
	_, err := s.RunOnce(ctx, "k", nil, func(ctx context.Context) (receipt, error) {
		assert.Equal(t, "v", ctx.Value(valueKey{}))
		_, ok := ctx.Deadline()
		assert.True(t, ok, "the execution timeout's deadline")
		inner, cancel := context.WithCancel(ctx)
		defer cancel()
		assert.NotEmpty(t, OperationKey(inner))
		n, err := Step(inner, "s", func(context.Context) (int, error) { return 7, nil })
		assert.NoError(t, err)
		assert.Equal(t, 7, n)
		return receipt{}, nil
	})
	require.NoError(t, err)

}

// The operation's context is its parent's for all but the operation: a
// context made from it ends when the parent does, with the parent's cause.
func TestOperationContextEndsWithItsParent(t *testing.T) {
	type valueKey struct{}
	parent, cancel := context.WithCancelCause(context.WithValue(context.Background(), valueKey{}, "v"))
	s := newStore[receipt](t, Options{})
	ctx, op := s.withOperation(parent, "k")
	assert.Same(t, op, ctx.Value(operationKey{}))
	assert.Equal(t, "v", ctx.Value(valueKey{}))
	inner, stop := context.WithCancel(ctx)
	defer stop()
	cause := errors.New("the caller left")
	cancel(cause)
	<-inner.Done()
	assert.ErrorIs(t, context.Cause(inner), cause)
	assert.ErrorIs(t, ctx.Err(), context.Canceled)
}
