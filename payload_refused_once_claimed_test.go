package idem

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/seed094d4201/idem/backend"
)

// claimGate is a stubBackend whose first Claim waits for release.
type claimGate struct {
	*stubBackend
	entered, release chan struct{}
}

func (g *claimGate) Claim(ctx context.Context, rec backend.Record, now time.Time, lease time.Duration) (backend.Record, bool, error) {
	select {
	case <-g.entered:
	default:
		close(g.entered)
		<-g.release
	}
	return g.stubBackend.Claim(ctx, rec, now, lease)
}

// A call with another payload that arrives while a key's claim is on its
// way to the Backend waits to learn whose payload the key holds; once the
// claim lands, the key is the other payload's and the call is refused
// with ErrPayloadMismatch then, not kept waiting for the whole execution
// (and answered ErrInProgress if its ctx ends first).
func TestOtherPayloadIsRefusedOnceTheClaimLands(t *testing.T) {
	g := &claimGate{stubBackend: newStubBackend(), entered: make(chan struct{}), release: make(chan struct{})}
	s := newStore[int](t, Options{Backend: g})
	running, finish := make(chan struct{}), make(chan struct{})
	defer close(finish)
	first := runAsync(context.Background(), s, "k", "a", func(context.Context) (int, error) {
		close(running)
		<-finish
		return 1, nil
	})
	<-g.entered
	parked := waitersParked(t, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	other := runAsync(ctx, s, "k", "b", func(context.Context) (int, error) {
		t.Error("fn ran for another payload while the key was held")
		return 2, nil
	})
	<-parked
	close(g.release)
	<-running
	select {
	case o := <-other:
		if !errors.Is(o.err, ErrPayloadMismatch) {
			t.Fatalf("the other payload got %v, want ErrPayloadMismatch", o.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the other payload still waits 10 s after the key's claim landed, for an execution it can never share")
	}
	finish <- struct{}{}
	if o := <-first; o.err != nil || o.val != 1 {
		t.Fatalf("first call: %v %v", o.val, o.err)
	}
}
