package bolt_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/bolt"
	bbolt "go.etcd.io/bbolt"
)

// A queue worker takes an order's items out of stock once per event, however
// often the event arrives: the stock change and the event's done note (the
// key's record) commit in one transaction of the store's own file.
func ExampleRunOnceTx() {
	dir, _ := os.MkdirTemp("", "idem-example")
	defer os.RemoveAll(dir)
	b, err := bolt.Open(filepath.Join(dir, "stock.db"), nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer b.Close()
	store := idem.New[uint64](idem.Options{Backend: b})
	defer store.Close()
	ctx := context.Background()

	stock := []byte("stock") // the worker's own bucket, beside idem's
	err = b.Update(ctx, func(tx *bbolt.Tx) error {
		bk, err := tx.CreateBucketIfNotExists(stock)
		if err != nil {
			return err
		}
		return bk.Put([]byte("dosa-mix"), binary.BigEndian.AppendUint64(nil, 10))
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	reserve := func(ctx context.Context, tx *bbolt.Tx) (uint64, error) {
		bk := tx.Bucket(stock)
		left := binary.BigEndian.Uint64(bk.Get([]byte("dosa-mix"))) - 2
		return left, bk.Put([]byte("dosa-mix"), binary.BigEndian.AppendUint64(nil, left))
	}
	for range 3 { // the broker hands the same event out three times
		left, err := bolt.RunOnceTx(ctx, store, "order-101-placed", "dosa-mix x2", reserve)
		fmt.Println("stock now", left, err)
	}
	// Output:
	// stock now 8 <nil>
	// stock now 8 <nil>
	// stock now 8 <nil>
}
