package idem_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/seed094d4201/idem"
)

// A message as a queue delivers it: at least once, so sometimes twice.
type message struct {
	ID     string // the producer's id for the event: the idempotency key
	SKU    string
	Change int
}

// A queue consumer applies each message once, whatever the broker
// redelivers: Begin claims the message's id, a duplicate finds the
// outcome remembered and is acked without applying it again, and a
// failure releases the id so that the redelivery applies it.
func ExampleStore_Begin() {
	store := idem.New[int](idem.Options{})
	defer store.Close()
	stock := map[string]int{"apple": 10}

	consume := func(ctx context.Context, m message) (ack bool) {
		t, err := store.Begin(ctx, m.ID, m)
		if err != nil {
			fmt.Println(m.ID, "not now:", err)
			return false // leave it to the broker's redelivery
		}
		if t.Replayed() {
			level, err := t.Result()
			fmt.Println(m.ID, "duplicate: acked, stock was", level, err)
			return true
		}
		defer t.Release() // an early return, or a panic, releases the id
		if stock[m.SKU]+m.Change < 0 {
			_, err := t.Finish(0, idem.Final(errors.New("out of stock")))
			fmt.Println(m.ID, "refused:", err)
			return true // a final answer: redelivering it changes nothing
		}
		stock[m.SKU] += m.Change
		level, _ := t.Finish(stock[m.SKU], nil)
		fmt.Println(m.ID, "applied: stock", level)
		return true
	}

	ctx := context.Background()
	for _, m := range []message{
		{"m1", "apple", -3},
		{"m2", "apple", -4},
		{"m1", "apple", -3}, // redelivered
		{"m3", "apple", -5},
		{"m3", "apple", -5}, // redelivered
	} {
		consume(ctx, m)
	}
	fmt.Println("final stock:", stock["apple"])
	// Output:
	// m1 applied: stock 7
	// m2 applied: stock 3
	// m1 duplicate: acked, stock was 7 <nil>
	// m3 refused: out of stock
	// m3 duplicate: acked, stock was 0 out of stock
	// final stock: 3
}
