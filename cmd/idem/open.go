package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/bolt"
	"github.com/seed094d4201/idem/postgres"
	"github.com/seed094d4201/idem/redis"
)

// A target is the backend a command works on, whatever it is.
type target interface {
	backend.Backend
	Each(ctx context.Context, fn func(backend.Record) error) error
}

// openTarget opens where: a postgres:// or postgresql:// DSN, a redis://
// URL, or else a bolt file. name is the table (postgres) or key prefix
// (redis); empty means the backend's default. It returns a func that closes
// what it opened.
func openTarget(ctx context.Context, where, name string, w io.Writer) (target, func(), error) {
	switch {
	case strings.HasPrefix(where, "postgres://"), strings.HasPrefix(where, "postgresql://"):
		pool, err := pgxpool.New(ctx, where)
		if err != nil {
			return nil, nil, err
		}
		// NoMigrate: an operator's tool never creates tables.
		b, err := postgres.New(ctx, pool, postgres.Options{Table: name, NoMigrate: true})
		if err != nil {
			pool.Close()
			return nil, nil, err
		}
		return b, pool.Close, nil
	case strings.HasPrefix(where, "redis://"), strings.HasPrefix(where, "rediss://"):
		opts, err := goredis.ParseURL(where)
		if err != nil {
			return nil, nil, err
		}
		rdb := goredis.NewClient(opts)
		if err := rdb.Ping(ctx).Err(); err != nil {
			rdb.Close()
			return nil, nil, err
		}
		return redis.New(rdb, redis.Options{Prefix: name}), func() { rdb.Close() }, nil
	}
	// bolt.Open would create a missing file; an operator means an existing one.
	if _, err := os.Stat(where); err != nil {
		return nil, nil, err
	}
	b, err := bolt.Open(where, nil)
	if errors.Is(err, bolt.ErrLocked) {
		return nil, nil, fmt.Errorf("%w (is the service that uses it still running?)", err)
	}
	if err != nil {
		return nil, nil, err
	}
	if n := b.Interrupted(); n > 0 {
		fmt.Fprintf(w, "note: %d key(s) were left in flight by a process that stopped; they are now interrupted\n", n)
	}
	return b, func() { b.Close() }, nil
}
