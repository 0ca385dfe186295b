package bolt_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/bolt"
)

// An outcome recorded before a restart is replayed after it: the charge
// runs once.
func Example() {
	dir, _ := os.MkdirTemp("", "idem-example")
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "payments.db")
	charges := 0
	charge := func(context.Context) (string, error) {
		charges++
		return fmt.Sprintf("charge %d", charges), nil
	}
	ctx := context.Background()

	for process := 1; process <= 2; process++ { // the service runs, stops, and runs again
		b, err := bolt.Open(path, nil)
		if err != nil {
			fmt.Println(err)
			return
		}
		store := idem.New[string](idem.Options{Backend: b})
		reply, err := store.RunOnce(ctx, "order-101", []byte(`{"amount":450}`), charge)
		fmt.Printf("process %d: %s, %v\n", process, reply, err)
		store.Close()
		b.Close()
	}
	fmt.Println("charges:", charges)
	// Output:
	// process 1: charge 1, <nil>
	// process 2: charge 1, <nil>
	// charges: 1
}
