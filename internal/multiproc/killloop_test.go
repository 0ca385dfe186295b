package multiproc

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"
	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/bolt"
	"github.com/seed094d4201/idem/internal/svctest"
	"github.com/seed094d4201/idem/postgres"
	"github.com/seed094d4201/idem/redis"
	"github.com/stretchr/testify/require"
)

// The kill loop: a child process runs RunOnce from many goroutines on a few
// hot keys and is SIGKILLed at a random moment, again and again, against one
// backend. Two append-only ledgers, written by the children, are the truth:
//
//	effects: "E key value", appended and fsynced inside fn (the side effect)
//	results: "S key value" after RunOnce returned a nil error (fsynced),
//	         "U key" ErrOutcomeUnknown, "P key" ErrInProgress, "X key error" anything else
//
// Nobody forgets (the operator step), so a key may have one effect at most,
// every success must carry its key's effect's value, and every success must
// replay, unchanged and without fn, after the last kill.
const (
	killLoopEnv     = "IDEM_KILLLOOP_CHILD" // the backend: "bolt", "postgres", "mysql" or "redis"
	killLoopNameEnv = "IDEM_KILLLOOP_NAME"  // bolt: the file; postgres: the table; redis: the key prefix
	killLoopDirEnv  = "IDEM_KILLLOOP_DIR"   // the directory holding the ledgers
	killLoopBaseEnv = "IDEM_KILLLOOP_BASE"  // the number of the child's first fresh key

	effectsLedger = "effects.log"
	resultsLedger = "results.log"
)

const (
	killLoopWorkers = 16                     // goroutines calling RunOnce in a child
	killLoopWindow  = 40                     // the hot keys: the newest this many
	killLoopFresh   = 8                      // one call in this many takes a fresh key
	killLoopLease   = 300 * time.Millisecond // short, so a dead child's claims lapse within a child's life
	killLoopMaxLife = 800 * time.Millisecond // a child is killed within this long after "ready"
)

// TestKillLoop kills a working child process many times per backend and
// checks the ledgers it leaves against the backend.
func TestKillLoop(t *testing.T) {
	kills := 8 // a plain go test ./...
	if svctest.Long() && !testing.Short() {
		kills = 25
	}
	t.Run("bolt", func(t *testing.T) {
		killLoop(t, "bolt", filepath.Join(t.TempDir(), "idem.db"), kills)
	})
	t.Run("postgres", func(t *testing.T) {
		pool := testPool(t) // or skip
		table := uniqueName("idem_kill_")
		dropLater(t, pool, table)
		killLoop(t, "postgres", table, kills)
	})
	t.Run("mysql", func(t *testing.T) {
		svctest.MySQL(t)
		table := uniqueName("idem_kill_")
		dropMySQLLater(t, table)
		killLoop(t, "mysql", table, kills)
	})
	t.Run("redis", func(t *testing.T) {
		addr := svctest.Redis(t)
		prefix := uniqueName("idemkill:") + ":"
		t.Cleanup(func() { deletePrefix(t, addr, prefix) })
		killLoop(t, "redis", prefix, kills)
	})
}

// killLoop starts and kills a child kills times against the backend kind
// under name, then checks the ledgers and replays every success.
func killLoop(t *testing.T, kind, name string, kills int) {
	dir := t.TempDir()
	base := 0
	for range kills {
		c := startChild(t,
			killLoopEnv+"="+kind, killLoopNameEnv+"="+name,
			killLoopDirEnv+"="+dir, killLoopBaseEnv+"="+strconv.Itoa(base))
		// A random delay picks the moment of the crash; it orders nothing.
		// Some children die at once, holding fresh claims; others live past
		// the lease of their predecessor's claims, and meet them interrupted.
		time.Sleep(5*time.Millisecond + rand.N(killLoopMaxLife))
		killHard(t, c)
		// A kill can tear a write that crosses a page of the file: cut the
		// torn line, which the next child would otherwise extend.
		cutTornLine(t, filepath.Join(dir, effectsLedger))
		cutTornLine(t, filepath.Join(dir, resultsLedger))
		// The next child's fresh keys start past every key the ledgers name,
		// and its hot window holds the newest keys of this one: those it left
		// claimed, completed, or interrupted.
		base = nextKey(readLedger(t, dir, effectsLedger), readLedger(t, dir, resultsLedger))
	}

	effects, results := readLedger(t, dir, effectsLedger), readLedger(t, dir, resultsLedger)
	var c killLoopCounts
	c.kills = kills
	var violations []string
	violate := func(format string, args ...any) {
		violations = append(violations, fmt.Sprintf("%s: ", kind)+fmt.Sprintf(format, args...))
	}

	effect := map[string]string{} // key -> the value its one effect returned
	effectLines := map[string][]string{}
	keys := map[string]bool{}
	for _, l := range effects {
		c.effects++
		keys[l.key] = true
		effectLines[l.key] = append(effectLines[l.key], l.raw)
		if _, dup := effect[l.key]; dup {
			continue // reported below with all its lines
		}
		effect[l.key] = l.value
	}
	for key, lines := range effectLines {
		if len(lines) > 1 {
			violate("key %s has %d effects with no operator step: %q", key, len(lines), lines)
		}
	}
	success := map[string]string{} // key -> the value RunOnce returned
	for _, l := range results {
		keys[l.key] = true
		switch l.kind {
		case "S":
			c.successes++
			e, ok := effect[l.key]
			switch {
			case !ok:
				violate("key %s succeeded with %q but has no effect: %q", l.key, l.value, l.raw)
			case e != l.value:
				violate("key %s succeeded with %q, its effect returned %q: %q, effects %q", l.key, l.value, e, l.raw, effectLines[l.key])
			}
			if s, ok := success[l.key]; ok && s != l.value {
				violate("key %s succeeded with %q and with %q", l.key, s, l.value)
			}
			success[l.key] = l.value
		case "U":
			c.unknown++
		case "P":
			c.inProgress++
		case "X":
			c.otherErrors++
			if c.otherErrors <= 5 {
				t.Logf("%s: unexpected error from a child: %s", kind, l.raw)
			}
		default:
			violate("results ledger has a line it cannot read: %q", l.raw)
		}
	}
	c.keys, c.successKeys = len(keys), len(success)

	// After the last kill, every key with an effect either replays that
	// effect's value or (killed before its outcome was recorded) is
	// interrupted; fn never runs again. A key that succeeded must replay.
	replayed, interrupted, fnRuns, vv := verifyReplay(t, kind, name, effect, success)
	c.replayed, c.interrupted = replayed, interrupted
	for _, v := range vv {
		violate("%s", v)
	}
	c.violations = len(violations)
	line := fmt.Sprintf("killloop %s: kills=%d keys=%d (hot window %d) effects=%d successes=%d success-keys=%d outcome-unknown=%d in-progress=%d other-errors=%d replayed-after=%d interrupted-after=%d fn-runs-after=%d violations=%d",
		kind, c.kills, c.keys, killLoopWindow, c.effects, c.successes, c.successKeys, c.unknown, c.inProgress, c.otherErrors, c.replayed, c.interrupted, fnRuns, c.violations)
	t.Log(line)
	fmt.Println(line)
	// go test shows a passing test's output only with -v: CI names a file
	// that collects the counts, and prints it.
	if report := os.Getenv("IDEM_KILLLOOP_REPORT"); report != "" {
		f, err := os.OpenFile(report, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		require.NoError(t, err)
		_, err = fmt.Fprintln(f, line)
		require.NoError(t, errors.Join(err, f.Close()))
	}
	for i, v := range violations {
		if i == 20 {
			t.Errorf("%s: and %d more violations", kind, len(violations)-i)
			break
		}
		t.Error(v)
	}
}

// killLoopCounts are the numbers a kill loop reports.
type killLoopCounts struct {
	kills, keys, effects, successes, successKeys int
	unknown, inProgress, otherErrors             int
	replayed, interrupted, violations            int
}

// verifyReplay runs, in this process, every key that has an effect or a
// success with an fn that must not be called, and returns how many replayed, how many are
// interrupted, how many times fn ran, and the violations found.
func verifyReplay(t *testing.T, kind, name string, effect, success map[string]string) (replayed, interrupted, fnRuns int, violations []string) {
	t.Helper()
	ctx := context.Background()
	store, closeStore, err := openKillLoopStore(ctx, kind, name)
	require.NoError(t, err)
	defer closeStore()

	var mu sync.Mutex // guards the results
	var ran atomic.Int32
	keys := make(chan string)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for key := range keys {
				cctx, cancel := context.WithTimeout(ctx, 10*time.Second) // past any dead child's lease
				var called atomic.Bool
				v, err := store.RunOnce(cctx, key, "payload", func(context.Context) (string, error) {
					called.Store(true)
					ran.Add(1)
					return "verify-run", nil
				})
				cancel()
				s, succeeded := success[key]
				mu.Lock()
				switch {
				case called.Load():
					violations = append(violations, fmt.Sprintf("key %s ran again after the kills (its effect returned %q, success %q)", key, effect[key], s))
				case err == nil && v == effect[key]:
					replayed++
				case err == nil:
					violations = append(violations, fmt.Sprintf("key %s replays %q after the kills, its effect returned %q", key, v, effect[key]))
				case errors.Is(err, idem.ErrOutcomeUnknown) && !succeeded:
					interrupted++
				case succeeded:
					violations = append(violations, fmt.Sprintf("key %s succeeded with %q before a kill but does not replay after: %v", key, s, err))
				default:
					violations = append(violations, fmt.Sprintf("key %s, with an effect %q, answers neither its value nor ErrOutcomeUnknown after the kills: %v", key, effect[key], err))
				}
				mu.Unlock()
			}
		}()
	}
	for key := range effect {
		keys <- key
	}
	for key := range success {
		if _, ok := effect[key]; !ok { // already a violation; replay it anyway
			keys <- key
		}
	}
	close(keys)
	wg.Wait()
	return replayed, interrupted, int(ran.Load()), violations
}

// killHard SIGKILLs the child and requires that it was still working: a child
// that exited on its own hit an error it could not carry on from.
func killHard(t *testing.T, c *child) {
	t.Helper()
	require.NoError(t, c.cmd.Process.Signal(syscall.SIGKILL))
	_ = c.cmd.Wait()
	ws, ok := c.cmd.ProcessState.Sys().(syscall.WaitStatus)
	require.True(t, ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL,
		"the child stopped before it was killed: %v", c.cmd.ProcessState)
}

// runKillLoopChild is the child: it works on the hot keys from
// killLoopWorkers goroutines until it is killed. It returns only if a ledger
// cannot be written.
func runKillLoopChild() error {
	ctx := context.Background()
	store, _, err := openKillLoopStore(ctx, os.Getenv(killLoopEnv), os.Getenv(killLoopNameEnv))
	if err != nil {
		return err
	}
	dir := os.Getenv(killLoopDirEnv)
	effects, err := openLedger(filepath.Join(dir, effectsLedger))
	if err != nil {
		return err
	}
	results, err := openLedger(filepath.Join(dir, resultsLedger))
	if err != nil {
		return err
	}
	base, err := strconv.ParseInt(os.Getenv(killLoopBaseEnv), 10, 64)
	if err != nil {
		return err
	}
	var next atomic.Int64 // the number of the next fresh key
	next.Store(base)
	var executions atomic.Int64
	var reported atomic.Int32
	pid := os.Getpid()
	failed := make(chan error, killLoopWorkers)

	for range killLoopWorkers {
		go func() {
			for {
				key := hotKey(&next)
				cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				v, err := store.RunOnce(cctx, key, "payload", func(context.Context) (string, error) {
					v := fmt.Sprintf("%d.%d", pid, executions.Add(1))
					if err := effects.append(true, "E", key, v); err != nil {
						// Neither a failure (another run would follow a
						// half-written effect) nor a success: die.
						fmt.Fprintln(os.Stderr, "kill loop child: effects ledger:", err)
						os.Exit(3)
					}
					return v, nil
				})
				cancel()
				switch {
				case err == nil:
					err = results.append(true, "S", key, v)
				case errors.Is(err, idem.ErrOutcomeUnknown):
					err = results.append(false, "U", key)
				case errors.Is(err, idem.ErrInProgress):
					err = results.append(false, "P", key)
				default:
					if reported.Add(1) <= 3 {
						fmt.Fprintf(os.Stderr, "kill loop child %d: %s: unexpected error: %v\n", pid, key, err)
					}
					err = results.append(false, "X", key, strings.ReplaceAll(err.Error(), "\n", " "))
				}
				if err != nil {
					failed <- err
					return
				}
			}
		}()
	}
	fmt.Println("ready")
	return <-failed
}

// hotKey picks one of the killLoopWindow newest keys, or now and then a fresh
// one, so that every child meets keys its predecessor left in every state and
// has executions in flight whenever it is killed.
func hotKey(next *atomic.Int64) string {
	i := int64(-1)
	if rand.IntN(killLoopFresh) != 0 {
		i = next.Load() - 1 - rand.Int64N(killLoopWindow)
	}
	if i < 0 {
		i = next.Add(1) - 1
	}
	return killLoopKey(i)
}

func killLoopKey(i int64) string { return fmt.Sprintf("k%07d", i) }

// openKillLoopStore opens the backend kind under name (a bolt file, a table,
// a Redis key prefix) and a store over it, and returns a func that closes
// both.
func openKillLoopStore(ctx context.Context, kind, name string) (*idem.Store[string], func(), error) {
	opts := idem.Options{TTL: time.Hour, Lease: killLoopLease}
	var closeBackend func()
	switch kind {
	case "bolt":
		b, err := bolt.Open(name, nil)
		if err != nil {
			return nil, nil, err
		}
		opts.Backend, closeBackend = b, func() { _ = b.Close() }
	case "postgres":
		pool, err := pgxpool.New(ctx, os.Getenv("IDEM_POSTGRES_DSN"))
		if err != nil {
			return nil, nil, err
		}
		b, err := postgres.New(ctx, pool, postgres.Options{Table: name})
		if err != nil {
			pool.Close()
			return nil, nil, err
		}
		opts.Backend, closeBackend = b, pool.Close
	case "mysql":
		b, closeDB, err := openMySQL(ctx, name)
		if err != nil {
			return nil, nil, err
		}
		opts.Backend, closeBackend = b, closeDB
	case "redis":
		rdb := goredis.NewUniversalClient(&goredis.UniversalOptions{Addrs: []string{os.Getenv("IDEM_REDIS_ADDR")}, PoolSize: 32})
		opts.Backend, closeBackend = redis.New(rdb, redis.Options{Prefix: name}), func() { _ = rdb.Close() }
	default:
		return nil, nil, fmt.Errorf("kill loop: unknown backend %q", kind)
	}
	store := idem.New[string](opts)
	return store, func() { _ = store.Close(); closeBackend() }, nil
}

// A ledger is a file that lines are appended to, each with one write, from
// any goroutine.
type ledger struct{ f *os.File }

func openLedger(path string) (*ledger, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	return &ledger{f: f}, err
}

// append writes fields as one line, and with sync, fsyncs it before
// returning.
func (l *ledger) append(sync bool, fields ...string) error {
	if _, err := l.f.WriteString(strings.Join(fields, " ") + "\n"); err != nil {
		return err
	}
	if sync {
		return l.f.Sync()
	}
	return nil
}

// A ledgerLine is one line of a ledger: its kind ("E", "S", "U", "P", "X"),
// its key, and the rest.
type ledgerLine struct{ kind, key, value, raw string }

// readLedger reads the ledger name in dir, if there is one yet. A last line
// without its newline was torn by a kill and is left out.
func readLedger(t *testing.T, dir, name string) []ledgerLine {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, name))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	require.NoError(t, err)
	if i := bytes.LastIndexByte(data, '\n'); i+1 < len(data) {
		t.Logf("%s: ignoring a torn last line %q", name, data[i+1:])
		data = data[:i+1]
	}
	var lines []ledgerLine
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		raw := sc.Text()
		f := strings.SplitN(raw, " ", 3)
		l := ledgerLine{kind: f[0], raw: raw}
		if len(f) > 1 {
			l.key = f[1]
		}
		if len(f) > 2 {
			l.value = f[2]
		}
		require.NotEmpty(t, l.key, "%s: a line without a key: %q", name, raw)
		lines = append(lines, l)
	}
	require.NoError(t, sc.Err())
	return lines
}

// cutTornLine truncates the ledger at path after its last newline. A torn
// effect is a kill in the middle of fn, before the effect was done: its key
// is left claimed, and meets the next child interrupted.
func cutTornLine(t *testing.T, path string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return
	}
	require.NoError(t, err)
	if i := bytes.LastIndexByte(data, '\n'); i+1 < len(data) {
		t.Logf("%s: cutting a torn last line %q", filepath.Base(path), data[i+1:])
		require.NoError(t, os.Truncate(path, int64(i+1)))
	}
}

// nextKey is one past the highest key number the ledgers name.
func nextKey(ledgers ...[]ledgerLine) int {
	n := 0
	for _, lines := range ledgers {
		for _, l := range lines {
			if i, err := strconv.Atoi(strings.TrimPrefix(l.key, "k")); err == nil && i+1 > n {
				n = i + 1
			}
		}
	}
	return n
}

// deletePrefix deletes every Redis key under prefix.
func deletePrefix(t *testing.T, addr, prefix string) {
	ctx := context.Background()
	rdb := goredis.NewClient(&goredis.Options{Addr: addr})
	defer rdb.Close()
	iter := rdb.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	var keys []string
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		t.Logf("redis cleanup: %v", err)
		return
	}
	for len(keys) > 0 {
		n := min(len(keys), 500)
		if err := rdb.Del(ctx, keys[:n]...).Err(); err != nil {
			t.Logf("redis cleanup: %v", err)
			return
		}
		keys = keys[n:]
	}
}

// Found in CI: a kill tore "E k0000406 " and the next child's line was
// appended to it, so the ledger lost k0000407's effect and the check saw a
// success without one. The torn line must be cut before a child appends.
func TestCutTornLineKeepsTheNextLine(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, effectsLedger)
	require.NoError(t, os.WriteFile(path, []byte("E k1 1.1\nE k2 "), 0o644))
	cutTornLine(t, path)
	l, err := openLedger(path)
	require.NoError(t, err)
	require.NoError(t, l.append(true, "E", "k3", "2.1"))
	require.NoError(t, l.f.Close())
	lines := readLedger(t, dir, effectsLedger)
	require.Len(t, lines, 2)
	require.Equal(t, []string{"k1", "k3"}, []string{lines[0].key, lines[1].key})
	require.Equal(t, "2.1", lines[1].value)
}
