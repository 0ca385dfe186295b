package idem

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestBadInputGetsClearErrors(t *testing.T) {
	s := newStore[int](t, Options{})
	ok := func(context.Context) (int, error) { return 1, nil }
	ctx := context.Background()
	for _, tc := range []struct {
		name    string
		ctx     context.Context
		key     string
		payload any
		fn      func(context.Context) (int, error)
		is      error  // sentinel the error must match, if any
		says    string // text the message must hold
	}{
		{name: "empty key", key: "", fn: ok, is: ErrInvalidKey, says: "empty"},
		{name: "key over 255 bytes", key: strings.Repeat("k", 256), fn: ok, is: ErrInvalidKey, says: "256 bytes"},
		{name: "key with newline", key: "order\n101", fn: ok, is: ErrInvalidKey, says: "control character"},
		{name: "key with NUL", key: "order\x00", fn: ok, is: ErrInvalidKey, says: "control character"},
		{name: "key with DEL", key: "order\x7f", fn: ok, is: ErrInvalidKey, says: "control character"},
		{name: "key with C1 control", key: "order\u0085", fn: ok, is: ErrInvalidKey, says: "control character"},
		{name: "key not UTF-8", key: "order\xff", fn: ok, is: ErrInvalidKey, says: "UTF-8"},
		{name: "nil fn", key: "k", says: "nil fn"},
		{name: "nil context", key: "k", fn: ok, says: "nil Context"},
		{name: "payload without JSON encoding", key: "k", payload: make(chan int), fn: ok, says: "unsupported type"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := ctx
			if tc.name == "nil context" {
				c = nil
			}
			if tc.payload == nil {
				tc.payload = "p"
			}
			_, err := s.RunOnce(c, tc.key, tc.payload, tc.fn)
			require.Error(t, err)
			if tc.is != nil {
				assert.ErrorIs(t, err, tc.is)
			}
			assert.Contains(t, err.Error(), tc.says)
			assert.Equal(t, 0, s.Len(), "a refused call must claim nothing")
		})
	}
}

func TestValidKeys(t *testing.T) {
	for _, key := range []string{"a", strings.Repeat("k", MaxKeyLen), "16fd2706-8baf-433b-82eb-8c7fada847da", "order 101/charge", "clé-€-日本"} {
		assert.NoError(t, CheckKey(key), "%q", key)
	}
}

func TestDoneContextClaimsNothing(t *testing.T) {
	s := newStore[int](t, Options{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	called := false
	_, err := s.RunOnce(ctx, "k", "p", func(context.Context) (int, error) { called = true; return 1, nil })
	assert.ErrorIs(t, err, context.Canceled)
	assert.False(t, called)
	assert.Equal(t, 0, s.Len())
}

func TestMaxKeys(t *testing.T) {
	clock := newFakeClock()
	s := newStore[int](t, Options{MaxKeys: 2, TTL: time.Minute, Now: clock.Now, SweepInterval: -1})
	calls, fn := counter()
	ctx := context.Background()
	for _, k := range []string{"a", "b"} {
		_, err := s.RunOnce(ctx, k, nil, fn)
		require.NoError(t, err)
	}
	_, err := s.RunOnce(ctx, "c", nil, fn)
	assert.ErrorIs(t, err, ErrFull)
	v, err := s.RunOnce(ctx, "a", nil, fn)
	require.NoError(t, err, "a known key still replays when full")
	assert.Equal(t, 1, v)
	assert.Equal(t, int32(2), calls.Load())

	// Expired entries hold no live key: a full store makes room from them
	// without waiting for the sweeper.
	clock.Advance(time.Minute)
	_, err = s.RunOnce(ctx, "c", nil, fn)
	require.NoError(t, err)
}

// Keys released by a failing fn give their slots back.
func TestMaxKeysAfterFailures(t *testing.T) {
	s := newStore[int](t, Options{MaxKeys: 2})
	failing := func(context.Context) (int, error) { return 0, errors.New("transient") }
	for i := range 10 {
		_, err := s.RunOnce(context.Background(), fmt.Sprint("fail-", i), nil, failing)
		require.ErrorContains(t, err, "transient")
	}
	_, fn := counter()
	for _, k := range []string{"a", "b"} {
		_, err := s.RunOnce(context.Background(), k, nil, fn)
		require.NoError(t, err, "a released key kept its slot")
	}
	_, err := s.RunOnce(context.Background(), "c", nil, fn)
	assert.ErrorIs(t, err, ErrFull)
}

type panickyJSON struct{}

func (panickyJSON) MarshalJSON() ([]byte, error) { panic("bad encoder") }

func TestPanickingPayloadEncoderIsAnError(t *testing.T) {
	s := newStore[int](t, Options{})
	_, fn := counter()
	_, err := s.RunOnce(context.Background(), "k", panickyJSON{}, fn)
	assert.ErrorContains(t, err, "bad encoder")
	assert.Equal(t, 0, s.Len())
}

// Many goroutines claiming distinct keys at once never take the store past
// MaxKeys, and every one that is refused gets ErrFull.
func TestMaxKeysUnderRace(t *testing.T) {
	const max, callers = 10, 200
	s := newStore[int](t, Options{MaxKeys: max})
	release := make(chan struct{})
	blocked := func(context.Context) (int, error) { <-release; return 1, nil }
	start := make(chan struct{})
	errs := make(chan error, callers)
	var wg sync.WaitGroup
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			_, err := s.RunOnce(ctx, fmt.Sprint("key-", i), nil, blocked)
			errs <- err
		}()
	}
	close(start)
	full := 0
	for range callers - max {
		require.ErrorIs(t, <-errs, ErrFull)
		full++
	}
	assert.Equal(t, max, s.Len())
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	assert.Equal(t, callers-max, full)
}

func TestClose(t *testing.T) {
	s := New[int](Options{})
	started, release := make(chan struct{}), make(chan struct{})
	var finished bool // written by fn, read after Close returns
	inFlight := runAsync(context.Background(), s, "k", "p", func(context.Context) (int, error) {
		close(started)
		<-release
		finished = true
		return 9, nil
	})
	<-started

	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	for s.Forget(context.Background(), "probe") != ErrClosed {
		runtime.Gosched() // until Close has begun
	}
	close(release)
	require.NoError(t, <-closed)
	assert.True(t, finished, "Close returned before the execution in flight finished")
	o := <-inFlight
	require.NoError(t, o.err, "an execution in flight at Close must still deliver its outcome")
	assert.Equal(t, 9, o.val)

	ctx := context.Background()
	_, err := s.RunOnce(ctx, "k", "p", func(context.Context) (int, error) { return 1, nil })
	assert.ErrorIs(t, err, ErrClosed)
	_, err = s.RunOnce(ctx, "new", "p", func(context.Context) (int, error) { return 1, nil })
	assert.ErrorIs(t, err, ErrClosed)
	assert.ErrorIs(t, s.Forget(ctx, "k"), ErrClosed)
	_, err = s.Sweep(ctx)
	assert.ErrorIs(t, err, ErrClosed)
	assert.NoError(t, s.Close(), "Close is idempotent")
}

func TestForget(t *testing.T) {
	s := newStore[int](t, Options{})
	calls, fn := counter()
	ctx := context.Background()
	_, err := s.RunOnce(ctx, "k", "p", fn)
	require.NoError(t, err)
	require.NoError(t, s.Forget(ctx, "k"))
	v, err := s.RunOnce(ctx, "k", "p", fn)
	require.NoError(t, err)
	assert.Equal(t, 2, v, "a forgotten key runs again")
	assert.NoError(t, s.Forget(ctx, "never-seen"))
	assert.ErrorIs(t, s.Forget(ctx, ""), ErrInvalidKey)

	started, release := make(chan struct{}), make(chan struct{})
	done := runAsync(ctx, s, "busy", "p", func(context.Context) (int, error) {
		close(started)
		<-release
		return 1, nil
	})
	<-started
	assert.ErrorIs(t, s.Forget(ctx, "busy"), ErrInProgress, "a key in flight cannot be forgotten")
	close(release)
	require.NoError(t, (<-done).err)
	assert.Equal(t, int32(2), calls.Load())
}

func TestExecutionTimeoutReleasesKey(t *testing.T) {
	s := newStore[int](t, Options{ExecutionTimeout: 20 * time.Millisecond})
	var sawDeadline bool
	_, err := s.RunOnce(context.Background(), "k", "p", func(ctx context.Context) (int, error) {
		_, sawDeadline = ctx.Deadline()
		<-ctx.Done() // a slow operation that honours its context
		return 0, ctx.Err()
	})
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.True(t, sawDeadline)
	assert.Equal(t, 0, s.Len(), "a timed-out key must be released")
	v, err := s.RunOnce(context.Background(), "k", "p", func(context.Context) (int, error) { return 3, nil })
	require.NoError(t, err)
	assert.Equal(t, 3, v)
}
