package sqlite_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/sqlite"
)

// The second seed article's stock worker: the event's done note (the key's
// record) and the stock change commit in one SQLite transaction, so a
// repeat is skipped, even after a restart, and a crash leaves neither.
func ExampleRunOnceTx() {
	dir, _ := os.MkdirTemp("", "idem-example")
	defer os.RemoveAll(dir)
	db, err := sqlite.Open(filepath.Join(dir, "stock.db"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer db.Close()
	ctx := context.Background()
	b, err := sqlite.New(ctx, db, sqlite.Options{})
	if err == nil {
		_, err = db.Exec(`CREATE TABLE stock (item TEXT PRIMARY KEY, count INTEGER);
INSERT INTO stock VALUES ('dosa-mix', 10)`)
	}
	if err != nil {
		fmt.Println(err)
		return
	}
	store := idem.New[int](idem.Options{Backend: b})
	defer store.Close()

	reserve := func(ctx context.Context, tx *sql.Tx) (int, error) {
		var left int
		err := tx.QueryRowContext(ctx, `UPDATE stock SET count = count - 2 WHERE item = 'dosa-mix' RETURNING count`).Scan(&left)
		return left, err
	}
	for range 3 { // the broker hands the same event out three times
		left, err := sqlite.RunOnceTx(ctx, store, "order-101-placed", "dosa-mix x2", reserve)
		fmt.Println("stock now", left, err)
	}
	// Output:
	// stock now 8 <nil>
	// stock now 8 <nil>
	// stock now 8 <nil>
}
