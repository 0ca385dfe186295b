package mysql_test

import (
	"context"
	"database/sql"
	"log"
	"os"
	"time"

	_ "github.com/go-sql-driver/mysql"
	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/mysql"
)

type Receipt struct {
	Charge int64 `json:"charge"`
}

// A store shared by every replica of a service through one MySQL or
// MariaDB table. (Not run as a test: it needs a database, IDEM_MYSQL_DSN,
// such as root@tcp(127.0.0.1:3306)/test.)
func Example() {
	ctx := context.Background()
	db, err := sql.Open("mysql", os.Getenv("IDEM_MYSQL_DSN")+"?interpolateParams=true")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	b, err := mysql.New(ctx, db, mysql.Options{}) // creates idem_keys if needed
	if err != nil {
		log.Fatal(err)
	}
	store := idem.New[Receipt](idem.Options{Backend: b, TTL: 24 * time.Hour})
	defer store.Close()

	r, err := store.RunOnce(ctx, "order-101", []byte(`{"amount":450}`), func(ctx context.Context) (Receipt, error) {
		return Receipt{Charge: 1}, nil // the side effect, once across every replica
	})
	log.Println(r, err)
}

// The key, your own writes and the outcome in one InnoDB transaction: a
// crash or an error leaves none of them.
func ExampleRunOnceTx() {
	ctx := context.Background()
	db, err := sql.Open("mysql", os.Getenv("IDEM_MYSQL_DSN"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	b, err := mysql.New(ctx, db, mysql.Options{})
	if err != nil {
		log.Fatal(err)
	}
	store := idem.New[Receipt](idem.Options{Backend: b})
	defer store.Close()

	r, err := mysql.RunOnceTx(ctx, store, "order-101", []byte(`{"amount":450}`), func(ctx context.Context, tx *sql.Tx) (Receipt, error) {
		res, err := tx.ExecContext(ctx, `INSERT INTO charges (order_id, amount) VALUES (101, 450)`)
		if err != nil {
			return Receipt{}, err
		}
		id, err := res.LastInsertId()
		return Receipt{Charge: id}, err
	})
	log.Println(r, err)
}
