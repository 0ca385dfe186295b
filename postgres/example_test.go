package postgres_test

import (
	"context"
	"log"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/postgres"
)

type Receipt struct {
	Charge int `json:"charge"`
}

// A store shared by every replica of a service through one PostgreSQL
// table. (Not run as a test: it needs a database, IDEM_POSTGRES_DSN.)
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("IDEM_POSTGRES_DSN"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	b, err := postgres.New(ctx, pool, postgres.Options{}) // creates idem_keys if needed
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

// The key, your own writes and the outcome in one transaction: a crash or
// an error leaves none of them.
func ExampleRunOnceTx() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("IDEM_POSTGRES_DSN"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	b, err := postgres.New(ctx, pool, postgres.Options{})
	if err != nil {
		log.Fatal(err)
	}
	store := idem.New[Receipt](idem.Options{Backend: b})
	defer store.Close()

	r, err := postgres.RunOnceTx(ctx, store, "order-101", []byte(`{"amount":450}`), func(ctx context.Context, tx pgx.Tx) (Receipt, error) {
		var id int
		err := tx.QueryRow(ctx, `INSERT INTO charges (order_id, amount) VALUES (101, 450) RETURNING id`).Scan(&id)
		return Receipt{Charge: id}, err
	})
	log.Println(r, err)
}
