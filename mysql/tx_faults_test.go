package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/internal/faultproxy"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// ExecutionTimeout ends fn's ctx while fn's last statement (sent with a ctx
// of its own) is still running; fn then returns a plain (non-final) error.
// database/sql's awaitDone goroutine marks the Tx done and queues its
// ROLLBACK behind the running statement; RunOnceTx's deferred rollback sees
// ErrTxDone. The session must not then send `SET autocommit = 1` on the
// same connection, racing that ROLLBACK: if the SET won, the open
// transaction (claim + fn's writes) would be COMMITTED. None of a failed
// fn's writes is committed.
func TestTimeoutRaceCommitsNothingOfAFailedFn(t *testing.T) {
	for _, variant := range []string{"StatementOwnCtx", "WaitCtxDone"} {
		t.Run(variant, func(t *testing.T) {
			db := testDB(t)
			b, table := testBackend(t, db)
			name := moves(t, db, table)
			s := idem.New[int](idem.Options{Backend: b, ExecutionTimeout: 60 * time.Millisecond})
			defer s.Close()
			leaked := 0
			const n = 25
			for i := range n {
				key := fmt.Sprint("k", i)
				_, err := RunOnceTx(context.Background(), s, key, "p", func(ctx context.Context, tx *sql.Tx) (int, error) {
					if _, err := tx.ExecContext(ctx, "INSERT INTO "+name+" (note) VALUES (?)", key); err != nil {
						return 0, err
					}
					if variant == "StatementOwnCtx" {
						_, _ = tx.ExecContext(context.Background(), "DO SLEEP(0.15)")
					} else {
						<-ctx.Done()
					}
					return 0, errors.New("fn failed")
				})
				require.Error(t, err)
				if count(t, db, "SELECT count(*) FROM "+name+" WHERE note = ?", key) > 0 {
					leaked++
					rec, found, _ := b.Get(context.Background(), key, time.Time{})
					t.Logf("%s: fn failed (%v) but its write COMMITTED; key found=%v state=%v", key, err, found, rec.State)
				}
			}
			assert.Zero(t, leaked, "of %d failed fns, %d had their writes committed by SET autocommit = 1", n, leaked)
		})
	}
}

// The reply to COMMIT is lost on a pool of one connection: the caller is
// told the outcome committed, as it did. Asking b.db about the session
// while the session still holds the pool's only connection could not be
// answered; it would wait SettleTimeout and report "nothing was committed".
func TestLostCommitReplyOnAPoolOfOneIsReportedCommitted(t *testing.T) {
	direct := testDB(t)
	_, table := testBackend(t, direct)
	db, proxy := proxiedDB(t)
	db.SetMaxOpenConns(1)
	b, err := New(context.Background(), db, Options{Table: table, NoMigrate: true})
	require.NoError(t, err)
	s := idem.New[int](idem.Options{Backend: b, SettleTimeout: 3 * time.Second})
	defer s.Close()
	start := time.Now()
	v, err := RunOnceTx(context.Background(), s, "k", "p", func(ctx context.Context, tx *sql.Tx) (int, error) {
		proxy.DropReply([]byte("COMMIT"), faultproxy.MySQLReplyDone)
		return 42, nil
	})
	<-proxy.Fired()
	t.Logf("after %v: v=%d err=%v", time.Since(start).Round(time.Millisecond), v, err)
	db2, gerr := New(context.Background(), direct, Options{Table: table, NoMigrate: true})
	require.NoError(t, gerr)
	r, ok, gerr := db2.Get(context.Background(), "k", time.Time{})
	require.NoError(t, gerr)
	t.Logf("record: found=%v state=%v", ok, r.State)
	assert.NoError(t, err, "the COMMIT took effect; the caller was told it did not")
}

// fn panics / Goexits on a pool of one: the connection comes back with
// autocommit on, and nothing of fn's is committed.
func TestPanicOrGoexitOnAPoolOfOneCommitsNothing(t *testing.T) {
	db := testDB(t)
	db.SetMaxOpenConns(1)
	s, _, name := txFixture(t, db)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	func() {
		defer func() { _ = recover() }()
		_, _ = RunOnceTx(ctx, s, "p", "p", func(ctx context.Context, tx *sql.Tx) (int, error) {
			_, _ = tx.ExecContext(ctx, "INSERT INTO "+name+" (note) VALUES ('panic')")
			panic("boom")
		})
	}()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, _ = RunOnceTx(ctx, s, "g", "p", func(ctx context.Context, tx *sql.Tx) (int, error) {
			_, _ = tx.ExecContext(ctx, "INSERT INTO "+name+" (note) VALUES ('goexit')")
			runtime.Goexit()
			return 0, nil
		})
	}()
	wg.Wait()
	var ac int
	require.NoError(t, db.QueryRowContext(ctx, "SELECT @@autocommit").Scan(&ac))
	assert.Equal(t, 1, ac, "pooled connection has autocommit on")
	assert.Zero(t, count(t, db, "SELECT count(*) FROM "+name), "nothing committed")
	v, err := RunOnceTx(ctx, s, "p", "p", func(ctx context.Context, tx *sql.Tx) (int, error) { return 3, nil })
	require.NoError(t, err)
	assert.Equal(t, 3, v)
}

// A duplicate RunOnceTx in another process (another *sql.DB, another
// Store) waits > 1 s on the first's row lock: it keeps retrying 1205 and
// then replays, fn once.
func TestDuplicateInAnotherProcessWaitsPastLockWait(t *testing.T) {
	for _, params := range [][]string{nil, {"interpolateParams=true"}} {
		t.Run(strings.Join(append(params, "prepared"), ","), func(t *testing.T) {
			db := testDB(t, params...)
			b1, table := testBackend(t, db)
			other := testDB(t, params...)
			b2, err := New(context.Background(), other, Options{Table: table, NoMigrate: true})
			require.NoError(t, err)
			s1 := idem.New[int](idem.Options{Backend: b1})
			defer s1.Close()
			s2 := idem.New[int](idem.Options{Backend: b2})
			defer s2.Close()
			var calls atomic.Int32
			started := make(chan struct{})
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				v, err := RunOnceTx(context.Background(), s1, "k", "p", func(ctx context.Context, tx *sql.Tx) (int, error) {
					calls.Add(1)
					close(started)
					time.Sleep(2500 * time.Millisecond)
					return 9, nil
				})
				assert.NoError(t, err)
				assert.Equal(t, 9, v)
			}()
			<-started
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			// Forget meanwhile: in progress, not a deletion.
			ferr := b2.Forget(ctx, "k", time.Time{})
			assert.ErrorIs(t, ferr, idem.ErrInProgress)
			v, err := RunOnceTx(ctx, s2, "k", "p", func(ctx context.Context, tx *sql.Tx) (int, error) {
				calls.Add(1)
				return 10, nil
			})
			wg.Wait()
			require.NoError(t, err)
			assert.Equal(t, 9, v)
			assert.Equal(t, int32(1), calls.Load())
			// plain Claim also waits past 1 s and then sees the outcome
			rec, _, err := b2.Claim(ctx, backend.Record{Key: "k", Token: "x"}, time.Time{}, time.Hour)
			require.NoError(t, err)
			assert.Equal(t, backend.StateCompleted, rec.State)
		})
	}
}

// fn misuses the session: SET autocommit = 1 (an implicit COMMIT), or
// START TRANSACTION, then writes more and fails. The connection must be
// discarded or come back with autocommit = 1 and no open transaction; a
// pool of one makes the next statement meet it.
func TestFnEndingItsTxLeavesACleanConnection(t *testing.T) {
	for _, stmt := range []string{"SET autocommit = 1", "START TRANSACTION", "SET autocommit = 0", "COMMIT"} {
		t.Run(stmt, func(t *testing.T) {
			db := testDB(t)
			db.SetMaxOpenConns(1)
			s, b, name := txFixture(t, db)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			_, err := RunOnceTx(ctx, s, "k", "p", func(ctx context.Context, tx *sql.Tx) (int, error) {
				if _, err := tx.ExecContext(ctx, stmt); err != nil {
					return 0, err
				}
				_, err := tx.ExecContext(ctx, "INSERT INTO "+name+" (note) VALUES ('after')")
				return 0, errors.Join(err, errors.New("fn failed"))
			})
			require.Error(t, err)
			after := count(t, db, "SELECT count(*) FROM "+name)
			rec, found, _ := b.Get(ctx, "k", time.Time{})
			t.Logf("%s: fn's later write committed=%d; key found=%v state=%v", stmt, after, found, rec.State)
			var ac int
			require.NoError(t, db.QueryRowContext(ctx, "SELECT @@autocommit").Scan(&ac))
			assert.Equal(t, 1, ac)
			var trx int
			require.NoError(t, db.QueryRowContext(ctx, "SELECT count(*) FROM information_schema.INNODB_TRX WHERE trx_mysql_thread_id = CONNECTION_ID()").Scan(&trx))
			assert.Zero(t, trx, "no transaction open on the pooled connection")
		})
	}
}
