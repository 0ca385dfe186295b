package resume

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"
	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/bolt"
	"github.com/seed094d4201/idem/internal/svctest"
	"github.com/seed094d4201/idem/mysql"
	"github.com/seed094d4201/idem/postgres"
	"github.com/seed094d4201/idem/redis"
	"github.com/seed094d4201/idem/sqlite"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The child is this test binary with childEnv set to a backend kind: it
// runs the operation on the backend at whereEnv, stops at killEnv's
// boundary, says "ready", and waits there for SIGKILL.
const (
	childEnv   = "IDEM_RESUME_CHILD"
	whereEnv   = "IDEM_RESUME_WHERE"
	killEnv    = "IDEM_RESUME_KILL"
	serviceEnv = "IDEM_RESUME_SERVICE"
)

// lease is short, so that the next process need not wait long for a dead
// owner's claim to lapse on a backend shared between processes.
const lease = time.Second

var steps = []string{"create-order", "charge", "notify"}

func TestMain(m *testing.M) {
	if kind := os.Getenv(childEnv); kind != "" {
		err := runChild(kind)
		fmt.Fprintln(os.Stderr, "child: not killed:", err)
		os.Exit(1)
	}
	os.Exit(svctest.M(m).Run())
}

func runChild(kind string) error {
	b, closeB, err := open(kind, os.Getenv(whereEnv))
	if err != nil {
		return err
	}
	defer closeB()
	s := idem.New[string](idem.Options{Backend: b, Resume: true, Lease: lease})
	stop := func() {
		fmt.Println("ready")
		select {} // until SIGKILL
	}
	_, err = s.RunOnce(context.Background(), "order-101", "p", func(ctx context.Context) (string, error) {
		return operation(ctx, os.Getenv(serviceEnv), os.Getenv(killEnv), stop)
	})
	return err
}

// operation is three steps, each calling the outside service with the
// step's derived key; stop is called at the boundary kill names.
func operation(ctx context.Context, url, kill string, stop func()) (string, error) {
	for i, name := range steps {
		if kill == fmt.Sprintf("before-%d", i+1) {
			stop()
		}
		_, err := idem.Step(ctx, name, func(ctx context.Context) (string, error) {
			if err := call(ctx, url, name, idem.StepKey(ctx)); err != nil {
				return "", err
			}
			if kill == fmt.Sprintf("inside-%d", i+1) {
				stop() // the effect happened; the step is not recorded
			}
			return name + " done", nil
		})
		if err != nil {
			return "", err
		}
		if kill == fmt.Sprintf("after-%d", i+1) {
			stop()
		}
	}
	return "order placed", nil
}

func call(ctx context.Context, url, step, key string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"?step="+step, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Idempotency-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return errors.New(resp.Status)
	}
	return nil
}

// service is the fake outside service: it applies a request once per
// Idempotency-Key, as a payment provider does, and counts what it applied
// and what it was asked, by step.
type service struct {
	mu      sync.Mutex
	seen    map[string]bool // guarded by mu
	effects map[string]int  // guarded by mu
	calls   map[string]int  // guarded by mu
}

func (s *service) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key, step := r.Header.Get("Idempotency-Key"), r.URL.Query().Get("step")
	if key == "" {
		http.Error(w, "no key", http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls[step]++
	if !s.seen[key] {
		s.seen[key] = true
		s.effects[step]++
	}
}

// open opens the backend of kind at where.
func open(kind, where string) (backend.Backend, func(), error) {
	switch kind {
	case "bolt":
		b, err := bolt.Open(where, nil)
		if err != nil {
			return nil, nil, err
		}
		return b, func() { b.Close() }, nil
	case "sqlite":
		db, err := sqlite.Open(where)
		if err != nil {
			return nil, nil, err
		}
		b, err := sqlite.New(context.Background(), db, sqlite.Options{})
		if err != nil {
			db.Close()
			return nil, nil, err
		}
		return b, func() { db.Close() }, nil
	case "postgres":
		pool, err := pgxpool.New(context.Background(), os.Getenv("IDEM_POSTGRES_DSN"))
		if err != nil {
			return nil, nil, err
		}
		b, err := postgres.New(context.Background(), pool, postgres.Options{Table: where})
		if err != nil {
			pool.Close()
			return nil, nil, err
		}
		return b, pool.Close, nil
	case "mysql":
		db, err := sql.Open("mysql", os.Getenv("IDEM_MYSQL_DSN"))
		if err != nil {
			return nil, nil, err
		}
		b, err := mysql.New(context.Background(), db, mysql.Options{Table: where})
		if err != nil {
			db.Close()
			return nil, nil, err
		}
		return b, func() { db.Close() }, nil
	case "redis":
		rdb := goredis.NewClient(&goredis.Options{Addr: os.Getenv("IDEM_REDIS_ADDR")})
		return redis.New(rdb, redis.Options{Prefix: where}), func() { rdb.Close() }, nil
	}
	return nil, nil, fmt.Errorf("unknown backend %q", kind)
}

// place returns where a test of kind keeps its records: a new file, or a
// new table dropped when the test ends; it skips a test whose service is
// not configured.
func place(t *testing.T, kind string) string {
	switch kind {
	case "bolt", "sqlite":
		return filepath.Join(t.TempDir(), "idem.db")
	case "redis":
		addr := svctest.Redis(t)
		prefix := "idem-resume-" + strconv.FormatInt(time.Now().UnixNano(), 36) + ":"
		t.Cleanup(func() {
			rdb := goredis.NewClient(&goredis.Options{Addr: addr})
			defer rdb.Close()
			if keys, err := rdb.Keys(context.Background(), prefix+"*").Result(); err == nil && len(keys) > 0 {
				rdb.Del(context.Background(), keys...)
			}
		})
		return prefix
	case "mysql":
		dsn := svctest.MySQL(t)
		table := "idem_resume_" + strconv.FormatInt(time.Now().UnixNano(), 36)
		t.Cleanup(func() {
			if db, err := sql.Open("mysql", dsn); err == nil {
				_, _ = db.Exec("DROP TABLE IF EXISTS " + table)
				db.Close()
			}
		})
		return table
	}
	dsn := svctest.Postgres(t)
	table := "idem_resume_" + strconv.FormatInt(time.Now().UnixNano(), 36)
	t.Cleanup(func() {
		if pool, err := pgxpool.New(context.Background(), dsn); err == nil {
			_, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+table)
			pool.Close()
		}
	})
	return table
}

// TestKilledAtEveryStepBoundary kills the process running a three-step
// operation before, inside and after each step; the next call, from this
// process, completes the operation, and each step's effect on the outside
// service happened exactly once (a step killed inside ran twice, with the
// same derived key, and the service recognised the repeat).
//
// A plain go test ./... kills once at each moment, each at another step
// (before the first, inside the second, after the third); IDEM_LONG=1
// kills at every moment of every step. The backends run at the same
// time: each case mostly waits out a dead child's lease.
func TestKilledAtEveryStepBoundary(t *testing.T) {
	for _, kind := range []string{"bolt", "sqlite", "postgres", "mysql", "redis"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			for i := range steps {
				for j, at := range []string{"before", "inside", "after"} {
					if i != j && !svctest.Long() {
						continue
					}
					kill := fmt.Sprintf("%s-%d", at, i+1)
					t.Run(kill, func(t *testing.T) { killedAt(t, kind, kill) })
				}
			}
		})
	}
}

func killedAt(t *testing.T, kind, kill string) {
	svc := &service{seen: map[string]bool{}, effects: map[string]int{}, calls: map[string]int{}}
	srv := httptest.NewServer(svc)
	defer srv.Close()
	where := place(t, kind)

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+kind, whereEnv+"="+where, killEnv+"="+kill, serviceEnv+"="+srv.URL)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "ready\n" {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("child did not reach %s: %q, %v", kill, line, err)
	}
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	_ = cmd.Wait()

	b, closeB, err := open(kind, where)
	require.NoError(t, err)
	defer closeB()
	// A store takes a dead owner's claim once it has watched it go
	// unrenewed for a part of its own Lease (Options.Lease): short, so the
	// wait is short, yet three times the child's, so that a slow disk
	// cannot cost this process its lease while it resumes.
	s := idem.New[string](idem.Options{Backend: b, Resume: true, Lease: 3 * lease})
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	got, err := s.RunOnce(ctx, "order-101", "p", func(ctx context.Context) (string, error) {
		return operation(ctx, srv.URL, "", nil)
	})
	require.NoError(t, err, "the next call completes the operation")
	assert.Equal(t, "order placed", got)

	svc.mu.Lock()
	defer svc.mu.Unlock()
	for _, name := range steps {
		assert.Equal(t, 1, svc.effects[name], "%s: its effect happened once", name)
	}
	if n := kill[len(kill)-1] - '1'; kill[:6] == "inside" {
		assert.Equal(t, 2, svc.calls[steps[n]], "the step killed inside ran again, with the same key")
	}
	again, err := s.RunOnce(ctx, "order-101", "p", func(ctx context.Context) (string, error) {
		return "", errors.New("ran again")
	})
	require.NoError(t, err)
	assert.Equal(t, got, again, "then its outcome replays")
}
