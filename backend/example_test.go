package backend_test

import (
	"fmt"
	"time"

	"github.com/seed094d4201/idem/backend"
)

// A backend that stores opaque values keeps each record in its compact
// binary form and reads it back field for field.
func ExampleRecord_MarshalBinary() {
	rec := backend.Record{
		Key:       "order-101",
		Token:     "0f1e2d3c",
		State:     backend.StateCompleted,
		CreatedAt: time.Unix(1764493200, 0),
		ExpiresAt: time.Unix(1764579600, 0),
		Value:     []byte(`{"charge":1}`),
	}
	data, err := rec.MarshalBinary()
	if err != nil {
		panic(err)
	}
	var back backend.Record
	if err := back.UnmarshalBinary(data); err != nil {
		panic(err)
	}
	fmt.Println(back.Key, back.State, string(back.Value), back.ExpiresAt.Equal(rec.ExpiresAt))
	// Output: order-101 completed {"charge":1} true
}
