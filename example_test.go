package idem_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/seed094d4201/idem"
)

type Receipt struct {
	Charge int
	Amount int
}

// A retry with the same key gets the first execution's answer; the charge
// runs once.
func Example() {
	store := idem.New[Receipt](idem.Options{})
	defer store.Close()

	charges := 0
	charge := func(ctx context.Context) (Receipt, error) {
		charges++
		return Receipt{Charge: charges, Amount: 450}, nil
	}
	ctx := context.Background()
	key := "16fd2706-8baf-433b-82eb-8c7fada847da" // made once, with the order
	first, _ := store.RunOnce(ctx, key, []byte(`{"order":101,"amount":450}`), charge)
	retry, _ := store.RunOnce(ctx, key, []byte(`{"order":101,"amount":450}`), charge)

	fmt.Println(first, retry, "charges:", charges)
	// Output: {1 450} {1 450} charges: 1
}

// A key reused for a different request is refused instead of answered with
// the first request's result.
func ExampleStore_RunOnce_payloadMismatch() {
	store := idem.New[Receipt](idem.Options{})
	defer store.Close()
	charge := func(ctx context.Context) (Receipt, error) { return Receipt{Charge: 1, Amount: 450}, nil }
	ctx := context.Background()

	_, _ = store.RunOnce(ctx, "pay-101-a", map[string]int{"order": 101, "amount": 450}, charge)
	_, err := store.RunOnce(ctx, "pay-101-a", map[string]int{"order": 102, "amount": 990}, charge)

	fmt.Println(errors.Is(err, idem.ErrPayloadMismatch))
	fmt.Println(err)
	// Output:
	// true
	// idem: key reused with a different payload
}

// An ordinary error releases the key so a retry runs again; an error marked
// Final is remembered and replayed.
func ExampleFinal() {
	store := idem.New[Receipt](idem.Options{})
	defer store.Close()
	ctx := context.Background()
	attempts := 0
	charge := func(ctx context.Context) (Receipt, error) {
		attempts++
		if attempts == 1 {
			return Receipt{}, errors.New("bank unreachable") // transient: not remembered
		}
		return Receipt{}, idem.Final(errors.New("card declined")) // definitive
	}

	for range 3 {
		_, err := store.RunOnce(ctx, "order-101", nil, charge)
		fmt.Printf("%v (final: %v)\n", err, idem.IsFinal(err))
	}
	fmt.Println("attempts:", attempts)
	// Output:
	// bank unreachable (final: false)
	// card declined (final: true)
	// card declined (final: true)
	// attempts: 2
}

// A panic in fn reaches the caller as a *PanicError; the key is released and
// the store keeps working.
func ExamplePanicError() {
	store := idem.New[int](idem.Options{})
	defer store.Close()
	_, err := store.RunOnce(context.Background(), "k", nil, func(context.Context) (int, error) {
		panic("out of paper")
	})
	var pe *idem.PanicError
	if errors.As(err, &pe) {
		fmt.Println("recovered:", pe.Value)
	}
	n, _ := store.RunOnce(context.Background(), "k", nil, func(context.Context) (int, error) { return 1, nil })
	fmt.Println("next call ran:", n)
	// Output:
	// recovered: out of paper
	// next call ran: 1
}

// Forget drops a remembered outcome, so the key runs afresh.
func ExampleStore_Forget() {
	store := idem.New[int](idem.Options{})
	defer store.Close()
	ctx := context.Background()
	runs := 0
	fn := func(context.Context) (int, error) { runs++; return runs, nil }

	_, _ = store.RunOnce(ctx, "nightly-report", nil, fn)
	_ = store.Forget(ctx, "nightly-report")
	n, _ := store.RunOnce(ctx, "nightly-report", nil, fn)
	fmt.Println(n)
	// Output: 2
}

// A caller can stop waiting without stopping the work: it gets an error that
// is both ErrInProgress and its context's error.
func ExampleErrInProgress() {
	store := idem.New[string](idem.Options{})
	defer store.Close()
	started, release := make(chan struct{}), make(chan struct{})
	done := make(chan string)
	go func() {
		v, _ := store.RunOnce(context.Background(), "k", nil, func(context.Context) (string, error) {
			close(started)
			<-release
			return "sent", nil
		})
		done <- v
	}()
	<-started

	// A duplicate that waits at most 10ms for the execution in flight.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	_, err := store.RunOnce(ctx, "k", nil, func(context.Context) (string, error) { return "never run", nil })
	fmt.Println(errors.Is(err, idem.ErrInProgress), errors.Is(err, context.DeadlineExceeded))

	close(release)
	fmt.Println(<-done)
	// Output:
	// true true
	// sent
}
