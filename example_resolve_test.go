package idem_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemtest"
)

// A consumer was killed after it applied message m3 and before it recorded
// that: the key is interrupted. The operator checks the stock, sees that
// m3 was applied, and resolves the key as done; the broker's late
// redelivery of m3 then replays that outcome and applies nothing.
func ExampleStore_Resolve() {
	ctx := context.Background()
	b := idemtest.NewMemoryBackend()
	fp, _ := idem.DefaultFingerprint("apples -5")
	_, _, _ = b.Claim(ctx, backend.Record{Key: "m3", Fingerprint: fp, Token: "killed-consumer", State: backend.StatePending}, time.Now(), time.Minute)
	b.Crash() // what the restarted service finds: the claim's owner is gone

	store := idem.New[int](idem.Options{Backend: b})
	defer store.Close()
	apply := func(context.Context) (int, error) {
		fmt.Println("applied again!")
		return 0, nil
	}
	_, err := store.RunOnce(ctx, "m3", "apples -5", apply)
	fmt.Println(errors.Is(err, idem.ErrOutcomeUnknown))

	if err := store.Resolve(ctx, "m3", 5, nil); err != nil { // the stock level after m3
		fmt.Println(err)
	}
	level, err := store.RunOnce(ctx, "m3", "apples -5", apply)
	fmt.Println(level, err)
	// Output:
	// true
	// 5 <nil>
}
