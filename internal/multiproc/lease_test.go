package multiproc

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/seed094d4201/idem/internal/svctest"
	"github.com/seed094d4201/idem/postgres"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// eachBackend runs test against a fresh postgres table, a fresh mysql
// table and a fresh redis prefix, with pool for counting side effects, skipping those whose service
// is not configured. With atOnce, the three run at the same time: for a
// test that mostly waits out a lease, and asserts no bound on its own
// timing.
func eachBackend(t *testing.T, atOnce bool, test func(t *testing.T, pool *pgxpool.Pool, kind, name string, b backend.Backend)) {
	pool := testPool(t)
	for _, kind := range []string{"postgres", "mysql", "redis"} {
		t.Run(kind, func(t *testing.T) {
			if atOnce {
				t.Parallel()
			}
			if kind == "redis" {
				svctest.Redis(t) // or skip
			}
			if kind == "mysql" {
				svctest.MySQL(t) // or skip
			}
			name := uniqueName("idemlease:") + ":"
			switch kind {
			case "postgres":
				name = uniqueName("idem_lease_")
				dropLater(t, pool, name)
			case "mysql":
				name = uniqueName("idem_lease_")
				dropMySQLLater(t, name)
			}
			b, closeBackend, err := open(context.Background(), kind, pool, name)
			require.NoError(t, err)
			t.Cleanup(closeBackend)
			test(t, pool, kind, name, b)
		})
	}
}

// A duplicate of a key in flight in another process waits only as long as
// its own ctx, through RunOnce and Begin alike: it polls the backend, and
// the poll ends with the ctx.
func TestDuplicateOfAnotherProcessWaitsOnlyItsCtx(t *testing.T) {
	eachBackend(t, false, func(t *testing.T, pool *pgxpool.Pool, kind, name string, b backend.Backend) {
		holder := startChild(t, childEnv+"="+kind, tableEnv+"="+name, holdEnv+"=k")
		defer holder.kill(t)
		s := idem.New[int](idem.Options{Backend: b})
		defer s.Close()
		entries := map[string]func(ctx context.Context) error{
			"RunOnce": func(ctx context.Context) error {
				_, err := s.RunOnce(ctx, "k", "p", func(context.Context) (int, error) {
					t.Error("fn ran while another process held the key")
					return 0, nil
				})
				return err
			},
			"Begin": func(ctx context.Context) error {
				tk, err := s.Begin(ctx, "k", "p")
				if err == nil {
					tk.Release()
					t.Error("Begin claimed a key another process holds")
				}
				return err
			},
		}
		for name, call := range entries {
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			start := time.Now()
			err := call(ctx)
			took := time.Since(start)
			cancel()
			assert.ErrorIs(t, err, idem.ErrInProgress, name)
			assert.ErrorIs(t, err, context.DeadlineExceeded, name)
			assert.Less(t, took, 1500*time.Millisecond, "%s waited past its ctx", name) // its ctx, and slack for a loaded machine
		}
	})
}

// A process that dies holding a claim taken through Begin leaves it as
// RunOnce's would: in progress while its lease holds, then interrupted.
func TestKilledTicketOwner(t *testing.T) {
	eachBackend(t, true, func(t *testing.T, pool *pgxpool.Pool, kind, name string, b backend.Backend) {
		startChild(t, childEnv+"="+kind, tableEnv+"="+name, holdEnv+"=k", beginEnv+"=1").kill(t)
		s := idem.New[int](idem.Options{Backend: b, Lease: holdLease}) // the holder's: stores that share a backend share one Lease
		defer s.Close()
		short, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		_, err := s.Begin(short, "k", "p")
		cancel()
		assert.ErrorIs(t, err, idem.ErrInProgress, "the dead owner's lease still holds")
		for deadline := time.Now().Add(30 * time.Second); ; {
			rec, _, err := b.Get(context.Background(), "k", time.Now())
			require.NoError(t, err)
			if rec.State == backend.StateInterrupted {
				break
			}
			require.True(t, time.Now().Before(deadline), "the lease never lapsed")
			time.Sleep(50 * time.Millisecond)
		}
		_, err = s.Begin(context.Background(), "k", "p")
		assert.ErrorIs(t, err, idem.ErrOutcomeUnknown)
	})
}

// A process that dies holding a claim: until its lease runs out others are
// told the key is in progress; after, its outcome is unknown; and with
// RetryInterrupted exactly one of many processes runs it again.
func TestKilledOwner(t *testing.T) {
	eachBackend(t, true, func(t *testing.T, pool *pgxpool.Pool, kind, name string, b backend.Backend) {
		// The child says ready from inside fn, holding the claim.
		startChild(t, childEnv+"="+kind, tableEnv+"="+name, holdEnv+"=k").kill(t)

		ctx := context.Background()
		var runs atomic.Int32
		fn := func(context.Context) (int, error) { runs.Add(1); return 7, nil }
		s := idem.New[int](idem.Options{Backend: b, Lease: holdLease}) // the holder's: stores that share a backend share one Lease
		defer s.Close()
		short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		_, err := s.RunOnce(short, "k", "p", fn)
		cancel()
		assert.ErrorIs(t, err, idem.ErrInProgress, "the dead owner's lease still holds")

		// Wait, by the clock, for the lease to run out.
		for deadline := time.Now().Add(30 * time.Second); ; {
			rec, _, err := b.Get(ctx, "k", time.Now())
			require.NoError(t, err)
			if rec.State == backend.StateInterrupted {
				break
			}
			require.True(t, time.Now().Before(deadline), "the lease never lapsed")
			time.Sleep(50 * time.Millisecond)
		}
		_, err = s.RunOnce(ctx, "k", "p", fn)
		assert.ErrorIs(t, err, idem.ErrOutcomeUnknown)
		assert.Zero(t, runs.Load())

		// Four processes retry it at once, with RetryInterrupted.
		effects := effectsTable(t, pool)
		var retries []*child
		for range 4 {
			retries = append(retries, startChild(t, childEnv+"="+kind, tableEnv+"="+name, effectsEnv+"="+effects, retryEnv+"=k"))
		}
		for _, c := range retries { // all at once
			c.goOn(t)
		}
		for _, c := range retries {
			c.wait(t)
		}
		assert.Equal(t, 1, countRows(t, pool, "SELECT count(*) FROM "+effects), "exactly one process re-executes")
		assert.Zero(t, runs.Load(), "this process only watched")
	})
}

// An owner that stalls past its lease (its renewals do not get through)
// loses the key to another store, and cannot then complete over the new
// owner's outcome.
func TestStalledOwnerIsFenced(t *testing.T) {
	eachBackend(t, false, func(t *testing.T, pool *pgxpool.Pool, kind, name string, b backend.Backend) {
		ctx := context.Background()
		stalled := idemtest.Faulty{Backend: b, Fail: func(op string) error {
			if op == "Renew" {
				return errors.New("network partition")
			}
			return nil
		}}
		// Long enough that the claim's reply lands within the store's
		// trust on a loaded machine, so fn starts.
		var un idemtest.Unrecorded
		const lease = 1500 * time.Millisecond
		old := idem.New[int](idem.Options{Backend: stalled, Lease: lease, Observer: un.Observer()})
		defer old.Close()
		inFn, resume := make(chan struct{}), make(chan struct{})
		result := make(chan error, 1)
		go func() {
			v, err := old.RunOnce(ctx, "k", "p", func(context.Context) (int, error) {
				close(inFn)
				<-resume
				return 1, nil
			})
			if err == nil && v != 1 {
				err = fmt.Errorf("the stalled owner was answered %d, not its own 1", v)
			}
			result <- err
		}()
		select {
		case <-inFn:
		case err := <-result:
			t.Fatalf("fn never started: %v", err)
		}
		for deadline := time.Now().Add(30 * time.Second); ; { // until the stalled owner's lease has run out
			rec, _, err := b.Get(ctx, "k", time.Now())
			require.NoError(t, err)
			if rec.State == backend.StateInterrupted {
				break
			}
			require.True(t, time.Now().Before(deadline), "the stalled owner's lease never lapsed")
			time.Sleep(20 * time.Millisecond)
		}
		fresh := idem.New[int](idem.Options{Backend: b, RetryInterrupted: true, Lease: lease}) // stores that share a backend share one Lease
		defer fresh.Close()
		v, err := fresh.RunOnce(ctx, "k", "p", func(context.Context) (int, error) { return 2, nil })
		require.NoError(t, err)
		assert.Equal(t, 2, v)

		close(resume)
		require.NoError(t, <-result, "the stalled owner's work took effect: it is answered")
		assert.ErrorIs(t, un.Of("k"), backend.ErrNotOwner, "its Observer is told the outcome was refused")
		v, err = fresh.RunOnce(ctx, "k", "p", func(context.Context) (int, error) { return 3, nil })
		require.NoError(t, err)
		assert.Equal(t, 2, v, "the record keeps the new owner's outcome")
		v, err = old.RunOnce(ctx, "k", "p", func(context.Context) (int, error) { return 4, nil })
		require.NoError(t, err)
		assert.Equal(t, 2, v, "the fenced store answers with the new owner's outcome, not its own refused one")
	})
}

// A process killed inside postgres.RunOnceTx leaves neither its write nor
// the key: the transaction dies with it.
func TestKilledTransaction(t *testing.T) {
	ctx := context.Background()
	pool := testPool(t)
	table, effects := uniqueName("idem_tx_"), effectsTable(t, pool)
	dropLater(t, pool, table)
	b, _, err := open(ctx, "postgres", pool, table)
	require.NoError(t, err)

	// The child says ready once it has written and holds the transaction open.
	startChild(t, childEnv+"=postgres", tableEnv+"="+table, effectsEnv+"="+effects, holdEnv+"=k", txEnv+"=1").kill(t)

	// The server rolls the transaction back when the connection drops; a
	// claim of the key waits on its row lock until then.
	s := idem.New[int](idem.Options{Backend: b})
	defer s.Close()
	v, err := postgresRunOnceTx(ctx, s, effects)
	require.NoError(t, err)
	assert.Equal(t, 1, v, "the key was free: this call ran")
	assert.Equal(t, 1, countRows(t, pool, "SELECT count(*) FROM "+effects), "only this call's write: the killed one left none")
}

// postgresRunOnceTx runs key "k" transactionally, writing one effect.
func postgresRunOnceTx(ctx context.Context, s *idem.Store[int], effects string) (int, error) {
	return postgres.RunOnceTx(ctx, s, "k", "p", func(ctx context.Context, tx pgx.Tx) (int, error) {
		_, err := tx.Exec(ctx, "INSERT INTO "+effects+" (key, pid) VALUES ('k', 0)")
		return 1, err
	})
}
