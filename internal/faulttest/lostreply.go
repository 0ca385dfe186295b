// Package faulttest holds fault scenarios that the shared backends' tests
// run against real servers: replies lost on the wire (through a
// faultproxy.Proxy) and stores whose clocks disagree. Each backend's tests
// describe how to reach it and how to recognise its requests; the
// scenarios are written once here.
package faulttest

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/internal/faultproxy"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A Target is a shared backend reached through a fault proxy.
type Target struct {
	Proxy   *faultproxy.Proxy
	Backend backend.Backend // through Proxy
	Direct  backend.Backend // the same records, not through Proxy: what landed

	// Bytes that occur in the request of each operation, and only in it,
	// and the reply detector for the protocol.
	Claim, Complete, Release []byte
	Done                     func(reply []byte) bool
}

// LostReplies checks that a Store over the target settles every lost reply
// and dropped request by the claim's token: fn runs at most once, no key is
// left stranded, and nothing that landed is reported lost. newTarget is
// called once per subtest and must return empty backends.
func LostReplies(t *testing.T, newTarget func(t *testing.T) Target) {
	t.Run("ClaimReplyLost", func(t *testing.T) {
		tg := newTarget(t)
		s := store(t, tg)
		tg.Proxy.DropReply(tg.Claim, tg.Done)
		calls, v, err := run(s, "k", 1)
		fired(t, tg)
		require.NoError(t, err, "the claim landed: fn runs under it")
		assert.Equal(t, 1, v)
		assert.Equal(t, int32(1), calls)
		assertState(t, tg, "k", backend.StateCompleted)
	})
	t.Run("ClaimRequestDropped", func(t *testing.T) {
		tg := newTarget(t)
		s := store(t, tg)
		tg.Proxy.DropRequest(tg.Claim)
		calls, _, err := run(s, "k", 1)
		fired(t, tg)
		if err != nil { // a client library may have retried it, and run fn
			var be *idem.BackendError
			require.ErrorAs(t, err, &be)
			assert.Zero(t, calls, "fn ran without a claim")
			assertAbsent(t, tg, "k")
		}
		calls2, v, err := run(s, "k", 2)
		require.NoError(t, err, "the key was left free")
		assert.Equal(t, int32(1), calls+calls2, "fn ran once in all")
		assert.Contains(t, []int{1, 2}, v)
	})
	t.Run("CompleteReplyLost", func(t *testing.T) {
		tg := newTarget(t)
		s := store(t, tg)
		calls, v, err := runArmed(s, "k", 3, func() { tg.Proxy.DropReply(tg.Complete, tg.Done) })
		fired(t, tg)
		require.NoError(t, err, "an outcome that landed is never reported lost")
		assert.Equal(t, 3, v)
		assert.Equal(t, int32(1), calls)
		assertState(t, tg, "k", backend.StateCompleted)
	})
	t.Run("CompleteConnectionKilled", func(t *testing.T) {
		tg := newTarget(t)
		s := store(t, tg)
		calls, v, err := runArmed(s, "k", 4, func() { tg.Proxy.DropRequest(tg.Complete) })
		fired(t, tg)
		require.NoError(t, err, "the outcome write is tried again on a fresh connection")
		assert.Equal(t, 4, v)
		assert.Equal(t, int32(1), calls)
		assertState(t, tg, "k", backend.StateCompleted)
	})
	t.Run("ReleaseReplyLost", func(t *testing.T) {
		tg := newTarget(t)
		s := store(t, tg)
		transient := errors.New("bank unreachable")
		_, err := s.RunOnce(context.Background(), "k", "p", func(context.Context) (int, error) {
			tg.Proxy.DropReply(tg.Release, tg.Done)
			return 0, transient
		})
		fired(t, tg)
		assert.ErrorIs(t, err, transient)
		assert.Equal(t, transient.Error(), err.Error(), "the release landed: the caller hears only fn's error")
		assertAbsent(t, tg, "k")
		calls, v, err := run(s, "k", 5)
		require.NoError(t, err, "a released key runs again")
		assert.Equal(t, 5, v)
		assert.Equal(t, int32(1), calls)
	})
}

func store(t *testing.T, tg Target) *idem.Store[int] {
	s := idem.New[int](idem.Options{Backend: tg.Backend, Lease: 10 * time.Second, SettleTimeout: 2 * time.Second})
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// run runs key with an fn that returns v, bounded so that a store stuck on
// its own claim fails the test rather than hanging it.
func run(s *idem.Store[int], key string, v int) (int32, int, error) {
	return runArmed(s, key, v, func() {})
}

// runArmed is run with arm called inside fn, before it returns.
func runArmed(s *idem.Store[int], key string, v int, arm func()) (int32, int, error) {
	var calls atomic.Int32
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	got, err := s.RunOnce(ctx, key, "p", func(context.Context) (int, error) {
		calls.Add(1)
		arm()
		return v, nil
	})
	return calls.Load(), got, err
}

func fired(t *testing.T, tg Target) {
	t.Helper()
	select {
	case <-tg.Proxy.Fired():
	default:
		t.Fatal("the fault did not fire: the test proved nothing")
	}
}

func assertState(t *testing.T, tg Target, key string, want backend.RecordState) {
	t.Helper()
	rec, ok, err := tg.Direct.Get(context.Background(), key, time.Now())
	require.NoError(t, err)
	require.True(t, ok, "no record for %q", key)
	assert.Equal(t, want, rec.State)
}

func assertAbsent(t *testing.T, tg Target, key string) {
	t.Helper()
	_, ok, err := tg.Direct.Get(context.Background(), key, time.Now())
	require.NoError(t, err)
	assert.False(t, ok, "%q is still held: stranded", key)
}
