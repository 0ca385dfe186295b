package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/seed094d4201/idem/postgres"
)

func init() { measurements["postgres"] = measurePostgres }

// measurePostgres fills a table of its own in the database
// IDEM_POSTGRES_DSN names, half of it with a TTL that lapses during the
// fill, then sweeps that half while new keys are claimed, printing the
// table's size, its dead rows and its HOT updates at each point. The table
// is dropped at the end.
func measurePostgres(ctx context.Context, c config) error {
	dsn := os.Getenv("IDEM_POSTGRES_DSN")
	if dsn == "" {
		return errors.New("IDEM_POSTGRES_DSN is not set")
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return err
	}
	cfg.MaxConns = callers
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	table := "idem_scale_" + strconv.FormatInt(time.Now().UnixNano(), 36)
	defer pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+table)
	b, err := postgres.New(ctx, pool, postgres.Options{Table: table})
	if err != nil {
		return err
	}
	if err := fillHalves(ctx, b, c.keys); err != nil {
		return err
	}
	stats := func(when string) error {
		time.Sleep(2 * time.Second) // other sessions flush their counters within a second
		var total, heap, idx, live, dead, upd, hot, vacuums int64
		err := pool.QueryRow(ctx, `SELECT pg_total_relation_size(relid), pg_table_size(relid), pg_indexes_size(relid),
    n_live_tup, n_dead_tup, n_tup_upd, n_tup_hot_upd, autovacuum_count
FROM pg_stat_user_tables WHERE relname = $1`, table).Scan(&total, &heap, &idx, &live, &dead, &upd, &hot, &vacuums)
		if err != nil {
			return err
		}
		fmt.Printf("%s: %d MB (table %d MB, indexes %d MB), %d live rows, %d dead, %d updates of which %d HOT, %d autovacuums\n",
			when, total>>20, heap>>20, idx>>20, live, dead, upd, hot, vacuums)
		return nil
	}
	if err := stats("after the fill"); err != nil {
		return err
	}
	size := func() int64 {
		var n int64
		_ = pool.QueryRow(ctx, "SELECT pg_total_relation_size($1::regclass)", table).Scan(&n)
		return n
	}
	if err := sweepUnderLoad(ctx, b, size); err != nil {
		return err
	}
	if err := stats("after the sweep"); err != nil {
		return err
	}
	var autovacuum string
	if err := pool.QueryRow(ctx, "SHOW autovacuum").Scan(&autovacuum); err != nil {
		return err
	}
	if autovacuum != "on" {
		// A server without autovacuum (this machine's): what one VACUUM,
		// as autovacuum would run at 1% dead rows, makes of the table.
		start := time.Now()
		if _, err := pool.Exec(ctx, "VACUUM (ANALYZE) "+table); err != nil {
			return err
		}
		fmt.Printf("autovacuum is %s on this server: VACUUM took %v\n", autovacuum, time.Since(start).Round(time.Millisecond))
		if err := stats("after VACUUM"); err != nil {
			return err
		}
		before := size()
		if err := newKeysFor(ctx, b, "new keys after VACUUM"); err != nil {
			return err
		}
		fmt.Printf("size before those new keys %d MB, after %d MB (the freed space reused)\n", before>>20, size()>>20)
	}
	return stats("at the end")
}
