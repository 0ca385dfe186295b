package bench

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/bolt"
	bbolt "go.etcd.io/bbolt"
)

// The bolt benchmarks write through fsync to the file system under
// b.TempDir(), as a service would.

var boltRecord = func() []byte {
	rec, err := backend.Record{
		Key:   "16fd2706-8baf-433b-82eb-8c7fada847da",
		State: backend.StateCompleted,
		Token: "0123456789abcdef0123456789abcdef",
		Value: []byte(`{"Charge":1,"Amount":450}`),
	}.MarshalBinary()
	if err != nil {
		panic(err)
	}
	return rec
}()

// rawBolt does the least a durable claim-then-record needs on bbolt: two
// writes per operation, the claim and the outcome, each committed and
// fsynced. batch groups them with DB.Batch, its batch size set to the number
// of writers so no writer waits for the timer: ideal group commit.
func rawBolt(b *testing.B, batch bool, writers int) func(key string) {
	db, err := bbolt.Open(filepath.Join(b.TempDir(), "raw.db"), 0o600, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { db.Close() })
	db.MaxBatchSize = writers
	bucket := []byte("records")
	if err := db.Update(func(tx *bbolt.Tx) error { _, err := tx.CreateBucket(bucket); return err }); err != nil {
		b.Fatal(err)
	}
	write := db.Update
	if batch {
		write = db.Batch
	}
	return func(key string) {
		for range 2 { // the claim, then the outcome
			if err := write(func(tx *bbolt.Tx) error { return tx.Bucket(bucket).Put([]byte(key), boltRecord) }); err != nil {
				panic(err)
			}
		}
	}
}

func idemBolt(b *testing.B) (*idem.Store[receipt], func(key string)) {
	be, err := bolt.Open(filepath.Join(b.TempDir(), "idem.db"), nil)
	if err != nil {
		b.Fatal(err)
	}
	s := idem.New[receipt](idem.Options{Backend: be})
	b.Cleanup(func() {
		s.Close()
		be.Close()
	})
	ctx := context.Background()
	fn := func(context.Context) (receipt, error) { return fnReceipt, nil }
	return s, func(key string) {
		if _, err := s.RunOnce(ctx, key, boxed, fn); err != nil {
			panic(err)
		}
	}
}

// BenchmarkBoltNewKey: a new key through a bolt-backed store (claim durable
// before fn, outcome durable before the answer) against the same two writes
// issued raw on bbolt, by one caller and by 64 at once.
func BenchmarkBoltNewKey(b *testing.B) {
	for _, g := range []int{1, 64} {
		for _, im := range []struct {
			name string
			new  func(b *testing.B) func(string)
		}{
			{"idem", func(b *testing.B) func(string) { _, do := idemBolt(b); return do }},
			{"raw-commits", func(b *testing.B) func(string) { return rawBolt(b, false, g) }},
			{"raw-batch", func(b *testing.B) func(string) { return rawBolt(b, true, g) }},
		} {
			if g == 1 && im.name == "raw-batch" {
				continue // a lone DB.Batch caller waits out the batch timer
			}
			b.Run(fmt.Sprintf("impl=%s/g=%d", im.name, g), func(b *testing.B) {
				do := im.new(b)
				keys := makeKeys(b.N)
				forEach(b, g, func(i int) { do(keys[i]) })
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
			})
		}
	}
}

// BenchmarkBoltReplay replays keys that live only in the file: with a
// backend, memory holds no completed keys.
func BenchmarkBoltReplay(b *testing.B) {
	for _, g := range []int{1, 32} {
		b.Run(fmt.Sprintf("impl=idem/g=%d", g), func(b *testing.B) {
			s, do := idemBolt(b)
			keys := makeKeys(replayKeys)
			parallel(64, len(keys), func(i int) { do(keys[i]) })
			if s.Len() != 0 {
				b.Fatalf("memory holds %d keys", s.Len())
			}
			forEach(b, g, func(i int) { do(keys[i%replayKeys]) })
		})
	}
}

// parallel calls op(i) for every i in [0, n) from g goroutines.
func parallel(g, n int, op func(i int)) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range g {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				op(i)
			}
		}()
	}
	wg.Wait()
}
