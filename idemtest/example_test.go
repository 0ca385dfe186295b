package idemtest_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemtest"
)

// MemoryBackend stands in for a durable backend in tests; Crash makes it
// look as a file reopened after its process died mid-operation does.
func ExampleMemoryBackend_Crash() {
	b := idemtest.NewMemoryBackend()
	owner := idem.New[int](idem.Options{Backend: b})
	t, _ := owner.Begin(context.Background(), "order-101", "450")
	b.Crash() // the owner's process dies before it records an outcome

	after := idem.New[int](idem.Options{Backend: b})
	defer after.Close()
	_, err := after.RunOnce(context.Background(), "order-101", "450", func(context.Context) (int, error) { return 1, nil })
	fmt.Println(errors.Is(err, idem.ErrOutcomeUnknown))

	t.Release() // (the test's own cleanup of the "dead" owner)
	owner.Close()
	// Output: true
}
