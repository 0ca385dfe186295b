package redis

import (
	"context"
	"errors"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/internal/faulttest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// silentServer is a Redis that hangs: it accepts every connection and
// never answers.
func silentServer(t *testing.T) string { return faulttest.SilentServer(t) }

// refusedAddr returns an address on 127.0.0.1 that refuses connections:
// one that was listened on and closed.
func refusedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

// calls names every call of the Backend and Stepper API, each made under
// ctx on b.
func calls(b *Backend) map[string]func(context.Context) error {
	claim := backend.Record{Key: "k", Token: "tok", State: backend.StatePending}
	return map[string]func(context.Context) error{
		"Claim": func(ctx context.Context) error {
			_, _, err := b.Claim(ctx, claim, time.Now(), time.Minute)
			return err
		},
		"Get": func(ctx context.Context) error {
			_, _, err := b.Get(ctx, "k", time.Now())
			return err
		},
		"Complete": func(ctx context.Context) error { return b.Complete(ctx, claim, time.Now(), time.Minute) },
		"Release":  func(ctx context.Context) error { return b.Release(ctx, "k", "tok") },
		"Renew":    func(ctx context.Context) error { return b.Renew(ctx, "k", "tok", time.Now(), time.Minute) },
		"Forget":   func(ctx context.Context) error { return b.Forget(ctx, "k", time.Now()) },
		"Sweep": func(ctx context.Context) error {
			_, err := b.Sweep(ctx, time.Now(), 100)
			return err
		},
		"RecordStep": func(ctx context.Context) error {
			return b.RecordStep(ctx, "k", "tok", backend.Step{Name: "s"}, time.Now())
		},
		"Resume": func(ctx context.Context) error {
			_, err := b.Resume(ctx, "k", "tok", "tok2", time.Now(), time.Minute)
			return err
		},
	}
}

// slack is how long after its ctx ends a call may take to return.
const slack = 700 * time.Millisecond

// An outcome is what one call returned, and how long it took.
type outcome struct {
	err  error
	took time.Duration
}

// callAll makes every call of calls(b) at once, each under a ctx of its
// own from newCtx, and returns what each returned.
func callAll(b *Backend, newCtx func() (context.Context, context.CancelFunc)) map[string]outcome {
	var mu sync.Mutex
	out := make(map[string]outcome)
	var wg sync.WaitGroup
	for name, call := range calls(b) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := newCtx()
			defer cancel()
			start := time.Now()
			err := call(ctx)
			took := time.Since(start)
			mu.Lock()
			out[name] = outcome{err, took}
			mu.Unlock()
		}()
	}
	wg.Wait()
	return out
}

// TestCallsEndWithCtx: against a Redis that accepts and never answers,
// every call returns once its ctx ends (by deadline or cancellation), with
// ctx's error, rather than when go-redis's socket timeouts (3 s by
// default) give up; whether or not the client has ContextTimeoutEnabled.
func TestCallsEndWithCtx(t *testing.T) {
	const wait = 300 * time.Millisecond
	for _, tc := range []struct {
		name   string
		client redis.Options
		cancel bool // end ctx by cancelling it, not by its deadline
	}{
		{"Deadline", redis.Options{}, false},
		{"Cancelled", redis.Options{}, true},
		{"ContextTimeoutEnabled/Deadline", redis.Options{ContextTimeoutEnabled: true}, false},
		{"ContextTimeoutEnabled/Cancelled", redis.Options{ContextTimeoutEnabled: true}, true},
		// A deadline far off, cancelled first: go-redis would wait for the
		// deadline or its ReadTimeout (3 s), whichever came first.
		{"CancelledBeforeItsDeadline", redis.Options{}, true},
		{"ContextTimeoutEnabled/CancelledBeforeItsDeadline", redis.Options{ContextTimeoutEnabled: true}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			opts := tc.client
			opts.Addr = silentServer(t)
			rdb := redis.NewClient(&opts)
			t.Cleanup(func() { rdb.Close() })
			want := context.DeadlineExceeded
			newCtx := func() (context.Context, context.CancelFunc) { return context.WithTimeout(context.Background(), wait) }
			if tc.cancel {
				want = context.Canceled
				newCtx = func() (context.Context, context.CancelFunc) {
					ctx, cancel := context.WithCancel(context.Background())
					if strings.HasSuffix(tc.name, "BeforeItsDeadline") {
						ctx, cancel = context.WithTimeout(context.Background(), time.Minute)
					}
					stop := time.AfterFunc(wait, cancel)
					return ctx, func() { stop.Stop(); cancel() }
				}
			}
			for name, o := range callAll(New(rdb, Options{}), newCtx) {
				assert.ErrorIs(t, o.err, want, name)
				assert.Less(t, o.took, wait+slack, "%s outlived its ctx by %v", name, o.took-wait)
			}
		})
	}
}

// TestRefusedConnection: with every connection refused, each call comes
// back with the connection error as soon as the client gives up dialling
// (MaxRetries -1: one try), not with a ctx error at the end of its ctx.
func TestRefusedConnection(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: refusedAddr(t), MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	newCtx := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.Background(), 10*time.Second)
	}
	for name, o := range callAll(New(rdb, Options{}), newCtx) {
		assert.ErrorIs(t, o.err, syscall.ECONNREFUSED, "%s: the connection error is returned", name)
		assert.False(t, errors.Is(o.err, context.DeadlineExceeded) || errors.Is(o.err, context.Canceled), "%s: a ctx error: %v", name, o.err)
		assert.Less(t, o.took, 2*time.Second, "%s waited on a refused connection", name)
	}
}

// bound runs the call on a goroutine of its own. If that call ends its
// goroutine with runtime.Goexit (a client hook that calls t.FailNow, say),
// bound reports an error, never the zero answer (zero, nil) that a
// deferred send would deliver: a call that did nothing is never done.
func TestBoundGoexitIsNotSuccess(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- bound0(ctx, new(dialWatch), func(context.Context) error { runtime.Goexit(); return nil })
	}()
	select {
	case err := <-done:
		require.Error(t, err, "bound reported a call that ended its goroutine (runtime.Goexit) as a success")
	case <-ctx.Done():
		t.Fatal("bound did not return")
	}
}

// exitOnScript ends the goroutine of the first script command sent once
// armed: the Complete of the outcome.
type exitOnScript struct{ armed atomic.Bool }

func (h *exitOnScript) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *exitOnScript) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *exitOnScript) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		switch cmd.Name() {
		case "eval", "evalsha":
			if h.armed.CompareAndSwap(true, false) {
				runtime.Goexit()
			}
		}
		return next(ctx, cmd)
	}
}

// Store-level: the Goexit in the hook during Complete once left the record
// pending while the store stopped renewing its lease and dropped the
// outcome from memory, so after one lease the key was interrupted (and
// with RetryInterrupted another store ran fn again). Now RunOnce answers
// the success, and if the record is still pending the store holds the
// outcome: the key replays it and fn never runs again.
func TestGoexitInCompleteReportsRecorded(t *testing.T) {
	rdb := testClient(t)
	h := &exitOnScript{}
	rdb.AddHook(h)
	b := testBackend(t, rdb)
	s := idem.New[string](idem.Options{Backend: b, SettleTimeout: time.Second})
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	val, err := s.RunOnce(ctx, "k", "p", func(context.Context) (string, error) {
		h.armed.Store(true)
		return "ok", nil
	})
	require.False(t, h.armed.Load(), "the hook did not fire: the test proved nothing")
	rec, found, gerr := b.Get(ctx, "k", time.Now())
	require.NoError(t, gerr)
	require.True(t, found)
	require.NoError(t, err)
	require.Equal(t, "ok", val)
	if rec.State != backend.StateCompleted {
		again, err := s.RunOnce(ctx, "k", "p", func(context.Context) (string, error) {
			return "", errors.New("fn ran again while its outcome was held unrecorded")
		})
		require.NoError(t, err)
		require.Equal(t, "ok", again, "the record is %v, yet the store does not hold the outcome", rec.State)
	}
}
