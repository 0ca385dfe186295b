package mysql

import (
	"context"
	"database/sql"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/seed094d4201/idem/internal/faultproxy"
	"github.com/seed094d4201/idem/internal/faulttest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// proxiedDB is a *sql.DB like IDEM_MYSQL_DSN's whose connections go
// through a fault proxy. interpolateParams: each statement goes whole, its
// text and values in one COM_QUERY, so that the proxy can tell them apart
// and a lost reply is the reply to an executed statement.
func proxiedDB(t *testing.T) (*sql.DB, *faultproxy.Proxy) {
	cfg, err := mysql.ParseDSN(testDSN(t))
	require.NoError(t, err)
	if cfg.TLS != nil {
		t.Fatal("IDEM_MYSQL_DSN must not use TLS: the fault proxy reads the SQL")
	}
	proxy := faultproxy.Start(t, cfg.Addr)
	cfg.Addr = proxy.Addr()
	cfg.InterpolateParams = true
	cfg.Timeout = 5 * time.Second
	connector, err := mysql.NewConnector(cfg)
	require.NoError(t, err)
	db := sql.OpenDB(connector)
	t.Cleanup(func() { db.Close() })
	return db, proxy
}

// Replies lost, and connections killed, between the store and the server.
func TestLostReplies(t *testing.T) {
	direct := testDB(t)
	faulttest.LostReplies(t, func(t *testing.T) faulttest.Target {
		b, table := testBackend(t, direct)
		db, proxy := proxiedDB(t)
		through, err := New(context.Background(), db, Options{Table: table, NoMigrate: true})
		require.NoError(t, err)
		return faulttest.Target{
			Proxy: proxy, Backend: through, Direct: b,
			Claim:    []byte("INSERT INTO"),
			Complete: []byte("SET state = 2"),
			Release:  []byte("DELETE FROM `" + table + "` WHERE `key` = _binary'k' AND token"),
			Done:     faultproxy.MySQLReplyDone,
		}
	})
}

// Stores whose clocks are a minute off either way, on one table.
func TestSkewedStores(t *testing.T) {
	db := testDB(t)
	faulttest.SkewedStores(t, func(t *testing.T) backend.Backend {
		b, _ := testBackend(t, db)
		return b
	})
}

// The reply to RunOnceTx's COMMIT is lost after the commit took effect: the
// caller is told the outcome, not an error, and a retry replays it. The
// session that committed is still there on the server, idle, until it is
// killed: the settling waits for it to be gone before it reads.
func TestRunOnceTxLostCommitReply(t *testing.T) {
	direct := testDB(t)
	_, table := testBackend(t, direct)
	db, proxy := proxiedDB(t)
	b, err := New(context.Background(), db, Options{Table: table, NoMigrate: true})
	require.NoError(t, err)
	s := idem.New[int](idem.Options{Backend: b})
	defer s.Close()
	var calls atomic.Int32
	fn := func(ctx context.Context, tx *sql.Tx) (int, error) {
		calls.Add(1)
		proxy.DropReply([]byte("COMMIT"), faultproxy.MySQLReplyDone)
		return 42, nil
	}
	v, err := RunOnceTx(context.Background(), s, "k", "p", fn)
	select {
	case <-proxy.Fired():
	default:
		t.Fatal("the COMMIT reply was not dropped: the test proved nothing")
	}
	require.NoError(t, err, "the transaction committed: its outcome is not an error")
	assert.Equal(t, 42, v)
	v, err = RunOnceTx(context.Background(), s, "k", "p", fn)
	require.NoError(t, err)
	assert.Equal(t, 42, v)
	assert.Equal(t, int32(1), calls.Load())
}

// The COMMIT never reaches the server: nothing committed, and the call
// says so; the key is free for the next.
func TestRunOnceTxCommitRequestDropped(t *testing.T) {
	direct := testDB(t)
	_, table := testBackend(t, direct)
	db, proxy := proxiedDB(t)
	b, err := New(context.Background(), db, Options{Table: table, NoMigrate: true})
	require.NoError(t, err)
	s := idem.New[int](idem.Options{Backend: b})
	defer s.Close()
	var calls atomic.Int32
	_, err = RunOnceTx(context.Background(), s, "k", "p", func(ctx context.Context, tx *sql.Tx) (int, error) {
		calls.Add(1)
		proxy.DropRequest([]byte("COMMIT"))
		return 1, nil
	})
	<-proxy.Fired()
	require.Error(t, err, "nothing committed")
	_, found, gerr := b.Get(context.Background(), "k", time.Time{})
	require.NoError(t, gerr)
	assert.False(t, found, "no key without its outcome")
	v, err := RunOnceTx(context.Background(), s, "k", "p", func(ctx context.Context, tx *sql.Tx) (int, error) {
		calls.Add(1)
		return 2, nil
	})
	require.NoError(t, err)
	assert.Equal(t, 2, v)
	assert.Equal(t, int32(2), calls.Load())
}

// A Store over a server that accepts connections and never answers
// returns when the caller's ctx ends.
func TestStoreOverSilentServer(t *testing.T) {
	db, err := sql.Open("mysql", "root@tcp("+faulttest.SilentServer(t)+")/test")
	require.NoError(t, err)
	defer db.Close()
	b := &Backend{db: db, q: newQueries("`idem_keys`", true), packet: 1 << 24}
	s := idem.New[int](idem.Options{Backend: b, SettleTimeout: 2 * time.Second})
	defer s.Close()
	const wait = time.Second
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	start := time.Now()
	_, err = s.RunOnce(ctx, "k", "p", func(context.Context) (int, error) { return 1, nil })
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Less(t, time.Since(start), wait+700*time.Millisecond, "the caller waited past its ctx")
}

// The database goes away while fn runs: the caller has its success, the
// Observer hears the outcome was not recorded, and nothing is recorded as
// completed.
func TestDatabaseClosedMidRun(t *testing.T) {
	direct := testDB(t)
	own := testDB(t)
	b, table := testBackend(t, own)
	var un idemtest.Unrecorded
	s := idem.New[int](idem.Options{Observer: un.Observer(), Backend: b, SettleTimeout: time.Second})
	defer s.Close()
	_, err := s.RunOnce(context.Background(), "k", "p", func(context.Context) (int, error) {
		own.Close()
		return 1, nil
	})
	require.NoError(t, err, "the caller is answered its success")
	require.NotNil(t, un.Of("k"), "the Observer is told the outcome was not recorded")
	var state int
	require.NoError(t, direct.QueryRow("SELECT state FROM "+table+" WHERE `key` = 'k'").Scan(&state))
	assert.Equal(t, int(backend.StatePending), state, "nothing recorded as completed")
}

// The connection is killed while its claim waits on a row lock (another
// transaction's uncommitted claim of the key): the server goes on with
// the statement after its client is gone, and it lands once the lock is
// let go. fn runs at most once, and the key is never stranded: it is
// completed, free, or interrupted for an operator, never pending for ever.
func TestConnectionKilledMidStatement(t *testing.T) {
	direct := testDB(t)
	_, table := testBackend(t, direct)
	db, proxy := proxiedDB(t)
	b, err := New(context.Background(), db, Options{Table: table, NoMigrate: true})
	require.NoError(t, err)
	s := idem.New[int](idem.Options{Backend: b, Lease: 2 * time.Second, SettleTimeout: time.Second})
	defer s.Close()

	holder, err := direct.Begin()
	require.NoError(t, err)
	defer holder.Rollback() // before s.Close, which waits for the claim
	_, err = holder.Exec("INSERT INTO `" + table + "` (`key`, fingerprint, token, state, created_at, failed, err_msg) VALUES ('k', REPEAT('x', 32), 'holder', 1, UTC_TIMESTAMP(6), FALSE, '')")
	require.NoError(t, err)

	var calls atomic.Int32
	done := make(chan error, 1)
	go func() {
		_, err := s.RunOnce(context.Background(), "k", "p", func(context.Context) (int, error) { calls.Add(1); return 1, nil })
		done <- err
	}()
	// Observed on the server, not slept for: the claim waits on the lock.
	require.Eventually(t, func() bool {
		var n int
		_ = direct.QueryRow("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE '%INSERT INTO `" + table + "`%' AND INFO NOT LIKE '%PROCESSLIST%'").Scan(&n)
		return n > 0
	}, 10*time.Second, 5*time.Millisecond)
	proxy.KillAll()
	require.NoError(t, holder.Rollback()) // the orphaned insert lands now
	err = <-done
	t.Logf("the caller was answered: %v", err)
	assert.LessOrEqual(t, calls.Load(), int32(1))

	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	for {
		rec, found, err := b.Get(ctx, "k", time.Time{})
		require.NoError(t, err)
		if !found || rec.State != backend.StatePending {
			t.Logf("settled: found=%v state=%v", found, rec.State)
			break
		}
		require.NoError(t, ctx.Err(), "the key stayed pending: stranded")
		time.Sleep(50 * time.Millisecond) // polling the record's state, not ordering goroutines
	}
	v, err := s.RunOnce(context.Background(), "k", "p", func(context.Context) (int, error) { calls.Add(1); return 2, nil })
	if err == nil {
		assert.Contains(t, []int{1, 2}, v)
	} else {
		assert.ErrorIs(t, err, idem.ErrOutcomeUnknown, "an interrupted key waits for an operator")
	}
	assert.LessOrEqual(t, calls.Load(), int32(1), "fn ran once at most")
}
