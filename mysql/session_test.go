package mysql

import (
	"context"
	"database/sql"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A transaction that ends inside fn without fn ending it (a deadlock
// victim, whose whole transaction InnoDB rolls back, claim included; here
// a ROLLBACK stands in for it) must not leave fn's later writes through tx
// committed one by one, as they would be on a session in autocommit: they
// are rolled back with the rest, and the key is free to run once.
func TestRunOnceTxRolledBackInsideFnCommitsNothing(t *testing.T) {
	db := testDB(t)
	s, _, name := txFixture(t, db)
	ctx := context.Background()
	_, err := RunOnceTx(ctx, s, "k", "p", func(ctx context.Context, tx *sql.Tx) (int, error) {
		if _, err := tx.ExecContext(ctx, "ROLLBACK"); err != nil {
			return 0, err
		}
		_, err := tx.ExecContext(ctx, "INSERT INTO "+name+" (note) VALUES ('after')")
		return 1, err
	})
	require.Error(t, err, "the outcome cannot be recorded")
	assert.Zero(t, count(t, db, "SELECT count(*) FROM "+name), "fn's write after the rollback is rolled back too")

	v, err := RunOnceTx(ctx, s, "k", "p", func(ctx context.Context, tx *sql.Tx) (int, error) {
		_, err := tx.ExecContext(ctx, "INSERT INTO "+name+" (note) VALUES ('once')")
		return 2, err
	})
	require.NoError(t, err, "the key was left free")
	assert.Equal(t, 2, v)
	assert.Equal(t, 1, count(t, db, "SELECT count(*) FROM "+name))
}

// The session state fn may leave on its connection that would break the
// backend's own statements does not follow the connection back to the
// pool: autocommit off (outcomes answered, never committed), a fixed
// timestamp (expiry from a wrong now), LOCK TABLES (every other table
// refused). A pool of one connection makes the next call meet it.
func TestRunOnceTxSessionStateDoesNotLeak(t *testing.T) {
	for _, c := range []struct {
		name  string
		stmts []string
	}{
		{"Autocommit", []string{"SET autocommit = 0"}},
		{"Timestamp", []string{"SET timestamp = 1000000"}},
		{"LockTables", []string{"LOCK TABLES %s WRITE"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			db := testDB(t)
			db.SetMaxOpenConns(1)
			s, b, name := txFixture(t, db)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_, _ = RunOnceTx(ctx, s, "tx", "p", func(ctx context.Context, tx *sql.Tx) (int, error) {
				for _, stmt := range c.stmts {
					if strings.Contains(stmt, "%s") {
						stmt = strings.ReplaceAll(stmt, "%s", name)
					}
					if _, err := tx.ExecContext(ctx, stmt); err != nil {
						return 0, err
					}
				}
				return 1, nil
			})

			// The next call on the one connection: answered, committed (seen
			// from another pool), and expiring a day from the server's now.
			v, err := s.RunOnce(ctx, "next", "p", func(context.Context) (int, error) { return 7, nil })
			require.NoError(t, err)
			assert.Equal(t, 7, v)
			other := testDB(t)
			ob, err := New(ctx, other, Options{Table: strings.Trim(b.q.t, "`"), NoMigrate: true})
			require.NoError(t, err)
			rec, found, err := ob.Get(ctx, "next", time.Time{})
			require.NoError(t, err)
			require.True(t, found, "the next call's outcome is committed")
			var now int64
			require.NoError(t, other.QueryRow(`SELECT `+since+serverNow+`)`).Scan(&now))
			assert.WithinDuration(t, time.UnixMicro(now).Add(24*time.Hour), rec.ExpiresAt, time.Minute, "expiry from the server's real now")
		})
	}
}

// Forget of a key whose RunOnceTx is in flight (its uncommitted claim row
// locked) answers ErrInProgress after a short wait, rather than queueing on
// the row lock and deleting the outcome the transaction commits.
func TestForgetDuringRunOnceTx(t *testing.T) {
	db := testDB(t)
	s, b, _ := txFixture(t, db)
	ctx := context.Background()
	started, finish := make(chan struct{}), make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, err := RunOnceTx(ctx, s, "k", "p", func(ctx context.Context, tx *sql.Tx) (int, error) {
			close(started)
			<-finish
			return 1, nil
		})
		assert.NoError(t, err)
	}()
	<-started
	fctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	err := b.Forget(fctx, "k", time.Time{})
	cancel()
	assert.ErrorIs(t, err, idem.ErrInProgress, "the key is in flight")
	close(finish)
	wg.Wait()
	rec, found, err := b.Get(ctx, "k", time.Time{})
	require.NoError(t, err)
	require.True(t, found, "the outcome committed after the Forget is kept")
	assert.Equal(t, backend.StateCompleted, rec.State)
}

// A claim whose caller gave up while it waited on another transaction's row
// lock does not wait on, and land, long after: the server gives it up
// within about a second, so the key is not left claimed by nobody.
func TestAbandonedClaimDoesNotLandLater(t *testing.T) {
	db := testDB(t)
	s, b, _ := txFixture(t, db)
	ctx := context.Background()
	started, finish := make(chan struct{}), make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = RunOnceTx(ctx, s, "k", "p", func(ctx context.Context, tx *sql.Tx) (int, error) {
			close(started)
			<-finish
			return 0, assert.AnError // rolls the claim back: the key is free
		})
	}()
	<-started
	cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	_, _, err := b.Claim(cctx, backend.Record{Key: "k", Token: "late", State: backend.StatePending}, time.Time{}, time.Hour)
	cancel()
	require.Error(t, err)
	// The server still holds the abandoned statement until its lock wait
	// ends; wait for no session to be waiting on a row lock of the table.
	waiting := func() int {
		return count(t, db, `SELECT count(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE ? AND INFO NOT LIKE '%PROCESSLIST%'`, "%INSERT INTO "+b.q.t+"%")
	}
	deadline := time.Now().Add(10 * time.Second)
	for waiting() > 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	assert.Zero(t, waiting(), "the abandoned claim stopped waiting on the server")
	close(finish)
	<-done
	_, found, err := b.Get(ctx, "k", time.Time{})
	require.NoError(t, err)
	assert.False(t, found, "no late claim holds the key")
}

// A server in Oracle-like modes, where ” is NULL, runs every statement.
func TestEmptyStringIsNull(t *testing.T) {
	for _, params := range [][]string{
		{"sql_mode=%27EMPTY_STRING_IS_NULL%27"},
		{"sql_mode=%27EMPTY_STRING_IS_NULL%27", "interpolateParams=true"},
	} {
		t.Run(strings.Join(params, "&"), func(t *testing.T) {
			db := testDB(t, params...)
			s, _, _ := txFixture(t, db)
			ctx := context.Background()
			v, err := s.RunOnce(ctx, "k", "p", func(context.Context) (int, error) { return 3, nil })
			require.NoError(t, err)
			assert.Equal(t, 3, v)
			v, err = RunOnceTx(ctx, s, "t", "p", func(context.Context, *sql.Tx) (int, error) { return 4, nil })
			require.NoError(t, err)
			assert.Equal(t, 4, v)
		})
	}
}

// A fn that sets its session's sql_mode (any mode, ORACLE, ANSI and
// NO_BACKSLASH_ESCAPES included) and time_zone, on a pool of one
// connection, whose later statements all meet those settings: its
// outcome is recorded and replayed from another store, and the next
// claims, a Forget and the listing work, with instants from the server's
// clock.
func TestRunOnceTxFnSessionSettings(t *testing.T) {
	for _, mode := range []string{"ORACLE", "ANSI", "NO_BACKSLASH_ESCAPES", "", "TRADITIONAL", "PAD_CHAR_TO_FULL_LENGTH", "STRICT_TRANS_TABLES,EMPTY_STRING_IS_NULL"} {
		for _, interpolate := range []string{"interpolateParams=false", "interpolateParams=true"} {
			t.Run(mode+"/"+interpolate, func(t *testing.T) {
				db := testDB(t, interpolate)
				db.SetMaxOpenConns(1)
				b, _ := testBackend(t, db)
				s := idem.New[int](idem.Options{Backend: b, TTL: time.Hour})
				defer s.Close()
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				calls := 0
				fn := func(ctx context.Context, tx *sql.Tx) (int, error) {
					calls++
					if _, err := tx.ExecContext(ctx, "SET SESSION sql_mode = ?", mode); err != nil {
						return 0, err
					}
					_, err := tx.ExecContext(ctx, "SET time_zone = '-11:00'")
					return 5, err
				}
				key := `tx\'"`
				v, err := RunOnceTx(ctx, s, key, "p", fn)
				require.NoError(t, err)
				require.Equal(t, 5, v)
				other := idem.New[int](idem.Options{Backend: b, TTL: time.Hour})
				defer other.Close()
				v, err = RunOnceTx(ctx, other, key, "p", fn)
				require.NoError(t, err)
				assert.Equal(t, 5, v)
				assert.Equal(t, 1, calls, "replayed")

				next := `next\'é`
				_, err = s.RunOnce(ctx, next, "p", func(context.Context) (int, error) { return 3, nil })
				require.NoError(t, err)
				rec, ok, err := b.Get(ctx, next, time.Time{})
				require.NoError(t, err)
				require.True(t, ok)
				assert.WithinDuration(t, time.Now().Add(time.Hour), rec.ExpiresAt, time.Minute, "expiry from the server's clock")
				require.NoError(t, s.Forget(ctx, next))
				var keys []string
				require.NoError(t, b.Each(ctx, func(r backend.Record) error { keys = append(keys, r.Key); return nil }))
				assert.Equal(t, []string{key}, keys)
			})
		}
	}
}
