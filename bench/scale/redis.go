package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/redis"
)

func init() { measurements["redis"] = measureRedis }

// measureRedis fills a prefix of its own on the Redis IDEM_REDIS_ADDR
// names and prints the memory per key (INFO used_memory before and after)
// and what keys the backend keeps besides the records. The prefix's keys
// are deleted at the end.
func measureRedis(ctx context.Context, c config) error {
	addr := os.Getenv("IDEM_REDIS_ADDR")
	if addr == "" {
		return errors.New("IDEM_REDIS_ADDR is not set")
	}
	rdb := goredis.NewClient(&goredis.Options{Addr: addr, PoolSize: callers})
	defer rdb.Close()
	prefix := "idem-scale-" + strconv.FormatInt(time.Now().UnixNano(), 36) + ":"
	defer deletePrefix(rdb, prefix)
	used := func() (int64, error) {
		info, err := rdb.Info(ctx, "memory").Result()
		if err != nil {
			return 0, err
		}
		for _, line := range strings.Split(info, "\r\n") {
			if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
				return strconv.ParseInt(v, 10, 64)
			}
		}
		return 0, errors.New("INFO memory has no used_memory")
	}
	before, err := used()
	if err != nil {
		return err
	}
	b := redis.New(rdb, redis.Options{Prefix: prefix})
	if err := fillHalves(ctx, b, c.keys); err != nil {
		return err
	}
	after, err := used()
	if err != nil {
		return err
	}
	keys, others, err := countPrefix(rdb, prefix)
	if err != nil {
		return err
	}
	fmt.Printf("used_memory grew %d MB: %.0f B per key filled, %.0f B per key still held (%d records, %d other keys)\n",
		(after-before)>>20, float64(after-before)/float64(c.keys), float64(after-before)/float64(max(keys, 1)), keys, others)
	return listAll(ctx, b)
}

// listAll times Store.Records over every record, and reports the most
// the Go heap held meanwhile and how long the first record took.
func listAll(ctx context.Context, b backend.Backend) error {
	s := idem.New[[]byte](idem.Options{Backend: b, SweepInterval: -1})
	defer s.Close()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	base, peak := ms.HeapAlloc, ms.HeapAlloc
	start := time.Now()
	var first time.Duration
	n := 0
	for _, err := range s.Records(ctx) {
		if err != nil {
			return err
		}
		if n++; n == 1 {
			first = time.Since(start)
		}
		if n%10_000 == 0 {
			runtime.ReadMemStats(&ms)
			peak = max(peak, ms.HeapAlloc)
		}
	}
	fmt.Printf("Store.Records: %d records in %v, the first after %v; the heap grew at most %d MB\n",
		n, time.Since(start).Round(time.Millisecond), first.Round(time.Microsecond), (peak-base)>>20)
	return nil
}

// countPrefix counts the records under prefix and the backend's other keys.
func countPrefix(rdb *goredis.Client, prefix string) (records, others int, err error) {
	iter := rdb.Scan(context.Background(), 0, prefix+"*", 10_000).Iterator()
	for iter.Next(context.Background()) {
		if strings.HasPrefix(iter.Val(), prefix+"k:") {
			records++
		} else {
			others++
		}
	}
	return records, others, iter.Err()
}

// deletePrefix deletes every key under prefix.
func deletePrefix(rdb *goredis.Client, prefix string) {
	ctx := context.Background()
	iter := rdb.Scan(ctx, 0, prefix+"*", 10_000).Iterator()
	var batch []string
	for iter.Next(ctx) {
		if batch = append(batch, iter.Val()); len(batch) == 10_000 {
			rdb.Unlink(ctx, batch...)
			batch = batch[:0]
		}
	}
	if len(batch) > 0 {
		rdb.Unlink(ctx, batch...)
	}
	fmt.Println("deleted the run's keys")
}
