package idem_test

import (
	"context"
	"errors"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemtest"
)

// declineError is an error type whose Error reads through a pointer: a
// nil *declineError, returned as an error, panics when read, the
// typed-nil mistake.
type declineError struct{ reason string }

func (e *declineError) Error() string { return "declined: " + e.reason }

// unwrapPanics is an error whose Unwrap panics.
type unwrapPanics struct{}

func (unwrapPanics) Error() string { return "unwrap panics" }
func (unwrapPanics) Unwrap() error { panic("unwrap panics") }

// The error the work returns is the user's code: its methods, which the
// store calls to classify and record it (Error, Unwrap, Is, As), may
// panic. That panic must not escape the library (on RunOnce's own
// goroutine it crashed the process), and the key must be settled.
func TestWorkErrorWhoseErrorMethodPanicsIsSettled(t *testing.T) {
	s := newStore[int](t, idem.Options{Backend: idemtest.NewMemoryBackend()})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var runs atomic.Int32
	fn := func(context.Context) (int, error) {
		runs.Add(1)
		var typedNil *declineError
		return 0, idem.Final(typedNil)
	}
	for range 2 {
		_, err := s.RunOnce(ctx, "order-1", "p", fn)
		if err == nil || !idem.IsFinal(err) {
			t.Fatalf("got %v, want a final error", err)
		}
		_ = err.Error() // readable
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("fn ran %d times, want once: a final outcome is replayed", n)
	}
}

func TestWorkErrorWhoseUnwrapPanicsReleasesTheKey(t *testing.T) {
	s := newStore[int](t, idem.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var runs atomic.Int32
	fn := func(context.Context) (int, error) {
		runs.Add(1)
		return 0, unwrapPanics{}
	}
	for range 2 {
		_, err := s.RunOnce(ctx, "order-1", "p", fn)
		var pe *idem.PanicError
		if !errors.As(err, &pe) {
			t.Fatalf("got %v, want a *PanicError", err)
		}
	}
	if n := runs.Load(); n != 2 {
		t.Fatalf("fn ran %d times, want twice: a failure before commit releases the key", n)
	}
}

func TestTicketFinishWithAnErrorWhoseMethodsPanicReturns(t *testing.T) {
	s := newStore[int](t, idem.Options{Backend: idemtest.NewMemoryBackend()})
	tk, err := s.Begin(context.Background(), "order-1", "p")
	if err != nil {
		t.Fatal(err)
	}
	defer tk.Release()
	_, err = tk.Finish(0, unwrapPanics{})
	if err == nil {
		t.Fatal("Finish returned no error")
	}
	_ = err.Error()
}

// goexitError is an error whose Error ends the goroutine.
type goexitError struct{}

func (goexitError) Error() string { runtime.Goexit(); return "" }

func TestTicketFinishWithAnErrorThatEndsTheGoroutineReleasesTheKey(t *testing.T) {
	s := newStore[int](t, idem.Options{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		tk, err := s.Begin(context.Background(), "order-1", "p")
		if err != nil {
			t.Error(err)
			return
		}
		tk.Finish(0, goexitError{}) // no deferred Release: Finish was reached
	}()
	<-done
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	tk, err := s.Begin(ctx, "order-1", "p")
	if err != nil {
		t.Fatalf("the key is still held: %v", err)
	}
	if tk.Replayed() {
		t.Fatal("replayed a failure")
	}
	tk.Release()
}

// An operator's error is read as the work's is: a typed nil given to
// Resolve must not panic out of it.
func TestResolveWithAnErrorWhoseErrorMethodPanicsReturns(t *testing.T) {
	mem := idemtest.NewMemoryBackend()
	owner := newStore[int](t, idem.Options{Backend: mem})
	tk, err := owner.Begin(context.Background(), "order-1", "p")
	if err != nil {
		t.Fatal(err)
	}
	defer tk.Release()
	mem.Crash() // its owner is dead: the key is interrupted
	operator := newStore[int](t, idem.Options{Backend: mem})
	var typedNil *declineError
	if err := operator.Resolve(context.Background(), "order-1", 0, typedNil); err != nil {
		t.Fatalf("Resolve: %v", err)
	}
	_, err = operator.RunOnce(context.Background(), "order-1", "p", func(context.Context) (int, error) {
		t.Error("fn ran for a resolved key")
		return 0, nil
	})
	if !idem.IsFinal(err) {
		t.Fatalf("got %v, want the resolved final error", err)
	}
}

// A step's error is the work's too: Step, called in the caller's own
// control flow under a Ticket, must not panic with it.
func TestStepWithAnErrorWhoseErrorMethodPanicsReturns(t *testing.T) {
	s := newStore[int](t, idem.Options{Backend: idemtest.NewMemoryBackend(), Resume: true})
	tk, err := s.Begin(context.Background(), "order-1", "p")
	if err != nil {
		t.Fatal(err)
	}
	defer tk.Release()
	_, err = idem.Step(tk.Context(), "charge", func(context.Context) (int, error) {
		var typedNil *declineError
		return 0, idem.Final(typedNil)
	})
	if !idem.IsFinal(err) {
		t.Fatalf("got %v, want a final error", err)
	}
	_ = err.Error()
}
