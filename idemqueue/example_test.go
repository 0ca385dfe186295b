package idemqueue_test

import (
	"context"
	"fmt"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemqueue"
)

// A broker delivers the message "order-42" twice; the handler runs once,
// and both deliveries are acked.
func Example() {
	store := idem.New[int](idem.Options{})
	defer store.Close()
	consumer, err := idemqueue.New(store, idemqueue.Options{})
	if err != nil {
		panic(err)
	}
	ship := func(context.Context) (int, error) {
		fmt.Println("shipping order 42")
		return 42, nil
	}
	for range 2 {
		d := consumer.Handle(context.Background(), "order-42", "the message's body", ship)
		fmt.Println(d.Action, d.Replayed)
	}
	// Output:
	// shipping order 42
	// ack false
	// ack true
}
