package multiproc

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"
	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/internal/svctest"
	"github.com/seed094d4201/idem/postgres"
	"github.com/seed094d4201/idem/redis"
	"github.com/stretchr/testify/require"
)

// The child process is this test binary started with childEnv set: it
// reads its settings from the environment, says "ready", waits for a line
// on stdin, then requests every key, and exits.
const (
	childEnv   = "IDEM_MULTIPROC_CHILD" // the backend: "postgres", "redis" or "redis-cluster"
	tableEnv   = "IDEM_MULTIPROC_TABLE" // the backend's table or key prefix
	effectsEnv = "IDEM_MULTIPROC_EFFECTS"
	keysEnv    = "IDEM_MULTIPROC_KEYS"
	holdEnv    = "IDEM_MULTIPROC_HOLD"  // set: claim this key, say "ready" inside fn, and block there
	txEnv      = "IDEM_MULTIPROC_TX"    // with holdEnv: hold the key inside postgres.RunOnceTx, after a write to the effects table
	retryEnv   = "IDEM_MULTIPROC_RETRY" // set: after "ready" and a line on stdin, run this key with RetryInterrupted, its effect an INSERT
	beginEnv   = "IDEM_MULTIPROC_BEGIN" // with holdEnv: hold the key through Store.Begin instead of RunOnce
)

// holdLease is the lease of the claim a "hold" child takes.
const holdLease = 3 * time.Second

func TestMain(m *testing.M) {
	if os.Getenv(killLoopEnv) != "" { // works until SIGKILLed (killloop_test.go)
		fmt.Fprintln(os.Stderr, "kill loop child:", runKillLoopChild())
		os.Exit(1)
	}
	if os.Getenv(queueKillEnv) != "" { // consumes until SIGKILLed (queue_killloop_test.go)
		fmt.Fprintln(os.Stderr, "queue kill loop child:", runQueueKillChild())
		os.Exit(1)
	}
	if os.Getenv(jsKillEnv) != "" { // consumes until SIGKILLed (jetstream_killloop_test.go)
		fmt.Fprintln(os.Stderr, "JetStream kill loop child:", runJetStreamKillChild())
		os.Exit(1)
	}
	if os.Getenv(childEnv) != "" {
		if err := runChild(); err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(svctest.M(m).Run())
}

// runChild runs one process's share of the race: every key, from 16
// goroutines, each side effect an INSERT into the effects table.
func runChild() error {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("IDEM_POSTGRES_DSN"))
	if err != nil {
		return err
	}
	defer pool.Close()
	backend, closeBackend, err := open(ctx, os.Getenv(childEnv), pool, os.Getenv(tableEnv))
	if err != nil {
		return err
	}
	defer closeBackend()
	if key := os.Getenv(holdEnv); key != "" && os.Getenv(txEnv) != "" && os.Getenv(childEnv) == "mysql" {
		return holdMySQLTx(ctx, backend, key)
	}
	if key := os.Getenv(holdEnv); key != "" && os.Getenv(txEnv) != "" {
		store := idem.New[int](idem.Options{Backend: backend})
		_, err := postgres.RunOnceTx(ctx, store, key, "p", func(ctx context.Context, tx pgx.Tx) (int, error) {
			if _, err := tx.Exec(ctx, "INSERT INTO "+os.Getenv(effectsEnv)+" (key, pid) VALUES ($1, $2)", key, os.Getpid()); err != nil {
				return 0, err
			}
			fmt.Println("ready")
			select {} // until SIGKILL
		})
		return err
	}
	if key := os.Getenv(retryEnv); key != "" {
		store := idem.New[int](idem.Options{Backend: backend, RetryInterrupted: true, TTL: time.Minute, Lease: holdLease})
		defer store.Close()
		fmt.Println("ready")
		if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
			return err
		}
		_, err := store.RunOnce(ctx, key, "p", func(ctx context.Context) (int, error) {
			_, err := pool.Exec(ctx, "INSERT INTO "+os.Getenv(effectsEnv)+" (key, pid) VALUES ($1, $2)", key, os.Getpid())
			return 7, err
		})
		return err
	}
	if key := os.Getenv(holdEnv); key != "" && os.Getenv(beginEnv) != "" {
		store := idem.New[int](idem.Options{Backend: backend, Lease: holdLease})
		t, err := store.Begin(ctx, key, "p")
		if err != nil {
			return err
		}
		defer t.Release()
		fmt.Println("ready")
		<-t.Context().Done() // until SIGKILL, or the lease is lost
		return context.Cause(t.Context())
	}
	if key := os.Getenv(holdEnv); key != "" {
		store := idem.New[int](idem.Options{Backend: backend, Lease: holdLease})
		_, err := store.RunOnce(ctx, key, "p", func(context.Context) (int, error) {
			fmt.Println("ready")
			select {} // until SIGKILL
		})
		return err
	}
	store := idem.New[int](idem.Options{Backend: backend, TTL: time.Minute}) // so Redis soon drops the keys
	defer store.Close()
	keys, _ := strconv.Atoi(os.Getenv(keysEnv))
	effects := os.Getenv(effectsEnv)
	pid := os.Getpid()

	fmt.Println("ready")
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		return err
	}
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	next := make(chan int)
	go func() {
		for k := range keys {
			next <- k
		}
		close(next)
	}()
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range next {
				key := fmt.Sprintf("key-%05d", k)
				_, err := store.RunOnce(ctx, key, k, func(ctx context.Context) (int, error) {
					_, err := pool.Exec(ctx, "INSERT INTO "+effects+" (key, pid) VALUES ($1, $2)", key, pid)
					return pid, err
				})
				if err != nil {
					errs <- fmt.Errorf("%s: %w", key, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// open returns the backend of kind ("postgres", "redis" or "redis-cluster")
// under name (a table, or a key prefix), and a func that closes what it
// opened.
func open(ctx context.Context, kind string, pool *pgxpool.Pool, name string) (backend.Backend, func(), error) {
	switch kind {
	case "postgres":
		b, err := postgres.New(ctx, pool, postgres.Options{Table: name})
		return b, func() {}, err
	case "mysql":
		return openMySQL(ctx, name)
	}
	opts := &goredis.UniversalOptions{Addrs: []string{os.Getenv("IDEM_REDIS_ADDR")}, PoolSize: 32}
	if kind == "redis-cluster" {
		opts.Addrs, opts.IsClusterMode = strings.Split(os.Getenv("IDEM_REDIS_CLUSTER_ADDRS"), ","), true
	}
	rdb := goredis.NewUniversalClient(opts)
	return redis.New(rdb, redis.Options{Prefix: name}), func() { rdb.Close() }, nil
}

// TestRaceAcrossProcesses: 4 processes request the same 2,000 keys at once;
// every key's side effect happens exactly once.
func TestRaceAcrossProcesses(t *testing.T) {
	pool := testPool(t)
	for _, kind := range []string{"postgres", "mysql", "redis", "redis-cluster"} {
		t.Run(kind, func(t *testing.T) {
			if kind == "redis" {
				svctest.Redis(t) // or skip
			}
			if kind == "mysql" {
				svctest.MySQL(t) // or skip
			}
			if kind == "redis-cluster" {
				svctest.RedisCluster(t) // or skip
			}
			const processes, keys = 4, 2000
			effects := effectsTable(t, pool)
			table := uniqueName("idemrace:") + ":"
			switch kind {
			case "postgres":
				table = uniqueName("idem_race_")
				dropLater(t, pool, table)
			case "mysql":
				table = uniqueName("idem_race_")
				dropMySQLLater(t, table)
			}

			var children []*child
			for range processes {
				children = append(children, startChild(t, childEnv+"="+kind, tableEnv+"="+table, effectsEnv+"="+effects, keysEnv+"="+strconv.Itoa(keys)))
			}
			if strings.HasPrefix(kind, "redis") { // the race starts on servers that know no script
				flushScripts(t, kind)
			}
			for _, c := range children { // all at once
				c.goOn(t)
			}
			for _, c := range children {
				c.wait(t)
			}

			require.Equal(t, keys, countRows(t, pool, "SELECT count(DISTINCT key) FROM "+effects), "every key's side effect happened")
			require.Equal(t, 1, countRows(t, pool, "SELECT coalesce(max(n), 0) FROM (SELECT count(*) AS n FROM "+effects+" GROUP BY key) g"), "a key's side effect happened more than once")
			require.Equal(t, keys, countRows(t, pool, "SELECT count(*) FROM "+effects))
		})
	}
}

// flushScripts empties the script cache of the Redis (every primary of the
// Cluster) that kind names, as a restart or a failover would.
func flushScripts(t *testing.T, kind string) {
	t.Helper()
	ctx := context.Background()
	if kind == "redis-cluster" {
		rdb := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: svctest.RedisCluster(t)})
		defer rdb.Close()
		require.NoError(t, rdb.ForEachMaster(ctx, func(ctx context.Context, node *goredis.Client) error {
			return node.ScriptFlush(ctx).Err()
		}))
		return
	}
	rdb := goredis.NewClient(&goredis.Options{Addr: svctest.Redis(t)})
	defer rdb.Close()
	require.NoError(t, rdb.ScriptFlush(ctx).Err())
}
