package bench

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/bolt"
)

// BenchmarkStepRecord: recording one step of a claimed key (RecordStep)
// against recording its outcome (Complete), the write a step adds to an
// operation, on bbolt by 1 and 16 callers (whose writes share commits).
func BenchmarkStepRecord(b *testing.B) {
	for _, g := range []int{1, 16} {
		for _, impl := range []string{"step", "complete"} {
			b.Run(fmt.Sprintf("impl=%s/g=%d", impl, g), func(b *testing.B) {
				be, err := bolt.Open(filepath.Join(b.TempDir(), "idem.db"), nil)
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { be.Close() })
				ctx := context.Background()
				keys := makeKeys(b.N)
				parallel(64, len(keys), func(i int) {
					if _, _, err := be.Claim(ctx, backend.Record{Key: keys[i], Token: "t"}, time.Now(), time.Hour); err != nil {
						panic(err)
					}
				})
				step := backend.Step{Name: "charge", Value: boltRecord}
				forEach(b, g, func(i int) {
					var err error
					if impl == "step" {
						err = be.RecordStep(ctx, keys[i], "t", step, time.Now())
					} else {
						err = be.Complete(ctx, backend.Record{Key: keys[i], Token: "t", Value: boltRecord}, time.Now(), time.Hour)
					}
					if err != nil {
						panic(err)
					}
				})
			})
		}
	}
}

// BenchmarkSteps: a new key through RunOnce on bbolt with Resume, whose fn
// records 0 or 3 steps: each step adds one write to the claim and the
// outcome.
func BenchmarkSteps(b *testing.B) {
	for _, g := range []int{1, 16} {
		for _, n := range []int{0, 3} {
			b.Run(fmt.Sprintf("steps=%d/g=%d", n, g), func(b *testing.B) {
				be, err := bolt.Open(filepath.Join(b.TempDir(), "idem.db"), nil)
				if err != nil {
					b.Fatal(err)
				}
				s := idem.New[receipt](idem.Options{Backend: be, Resume: true})
				b.Cleanup(func() {
					s.Close()
					be.Close()
				})
				ctx := context.Background()
				fn := func(ctx context.Context) (receipt, error) {
					for i := range n {
						if _, err := idem.Step(ctx, stepNames[i], func(context.Context) (receipt, error) { return fnReceipt, nil }); err != nil {
							return receipt{}, err
						}
					}
					return fnReceipt, nil
				}
				keys := makeKeys(b.N)
				forEach(b, g, func(i int) {
					if _, err := s.RunOnce(ctx, keys[i], boxed, fn); err != nil {
						panic(err)
					}
				})
			})
		}
	}
}

var stepNames = []string{"create-order", "charge", "notify"}
