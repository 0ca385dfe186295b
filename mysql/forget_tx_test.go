package mysql

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// forgetWhileTxEnds has a Forget, from a Backend of its own (another
// process's store), meet the row lock of a RunOnceTx whose fn is running
// on key, and that transaction end (fn returns, and it commits or rolls
// back) while the Forget waits on the lock. It returns the RunOnceTx's
// error and the Forget's.
func forgetWhileTxEnds(t *testing.T, db *sql.DB, s *idem.Store[int], b *Backend, key string, fn func(context.Context, *sql.Tx) (int, error)) (txErr, forgetErr error) {
	t.Helper()
	ctx := context.Background()
	operator, err := New(ctx, db, Options{Table: unquoted(b), NoMigrate: true})
	require.NoError(t, err)
	running, finish := make(chan struct{}), make(chan struct{})
	ran := make(chan error, 1)
	go func() {
		_, err := RunOnceTx(ctx, s, key, "p", func(ctx context.Context, tx *sql.Tx) (int, error) {
			close(running)
			<-finish
			return fn(ctx, tx)
		})
		ran <- err
	}()
	<-running
	forgot := make(chan error, 1)
	go func() { forgot <- operator.Forget(ctx, key, time.Time{}) }()
	// Until the Forget waits on the transaction's row lock (a lock wait
	// on the table): then fn returns, and the transaction ends. InnoDB
	// refreshes INNODB_TRX only when it was not read for 100 ms, hence
	// the pause between reads.
	for {
		if count(t, db, `SELECT count(*) FROM information_schema.INNODB_TRX
WHERE trx_state = 'LOCK WAIT' AND trx_query LIKE ?`, "%"+b.q.t+"%") > 0 {
			break
		}
		select {
		case err := <-forgot:
			close(finish)
			<-ran
			t.Fatalf("the Forget answered (%v) without waiting on the row lock of the transaction in flight", err)
		case <-time.After(120 * time.Millisecond):
		}
	}
	close(finish)
	return <-ran, <-forgot
}

// unquoted is b's table name as Options.Table takes it.
func unquoted(b *Backend) string {
	return b.q.t[1 : len(b.q.t)-1]
}

// expiredOutcome leaves an expired outcome of key in b's table.
func expiredOutcome(t *testing.T, b *Backend, key string) {
	t.Helper()
	ctx := context.Background()
	claim, won, err := b.Claim(ctx, backend.Record{Key: key, Token: "old", State: backend.StatePending}, time.Time{}, time.Minute)
	require.NoError(t, err)
	require.True(t, won)
	require.NoError(t, b.Complete(ctx, claim, time.Time{}, time.Microsecond))
	for {
		if _, found, err := b.Get(ctx, key, time.Time{}); err != nil || !found {
			require.NoError(t, err)
			return
		}
	}
}

// A Forget that waited on the row lock of a RunOnceTx in flight, and sees
// it go as that transaction commits, answers ErrInProgress: it does not
// delete the outcome just committed, on a new key or one the transaction
// took over from an expired outcome.
func TestForgetThatWaitedOnRunOnceTxKeepsItsOutcome(t *testing.T) {
	db := testDB(t)
	for _, c := range []struct {
		name    string
		expired bool
	}{{"NewKey", false}, {"ExpiredKeyTakenOver", true}} {
		t.Run(c.name, func(t *testing.T) {
			s, b, _ := txFixture(t, db)
			if c.expired {
				expiredOutcome(t, b, "k")
			}
			txErr, err := forgetWhileTxEnds(t, db, s, b, "k", func(context.Context, *sql.Tx) (int, error) { return 1, nil })
			require.NoError(t, txErr, "the RunOnceTx commits")
			assert.ErrorIs(t, err, idem.ErrInProgress, "a Forget of a key in flight")
			rec, found, err := b.Get(context.Background(), "k", time.Time{})
			require.NoError(t, err)
			require.True(t, found, "the outcome the transaction committed while the Forget waited was deleted")
			assert.Equal(t, backend.StateCompleted, rec.State)
		})
	}
}

// A Forget that waited on a RunOnceTx that rolled back (fn failed) finds
// the key as it was: an expired outcome, which it deletes, or nothing.
func TestForgetThatWaitedOnRolledBackRunOnceTx(t *testing.T) {
	db := testDB(t)
	s, b, _ := txFixture(t, db)
	expiredOutcome(t, b, "k")
	txErr, err := forgetWhileTxEnds(t, db, s, b, "k", func(context.Context, *sql.Tx) (int, error) { return 0, assert.AnError })
	require.ErrorIs(t, txErr, assert.AnError)
	require.NoError(t, err, "the key is not in flight any more")
	assert.Zero(t, count(t, db, "SELECT count(*) FROM "+b.q.t), "the expired outcome is forgotten")
	require.NoError(t, b.Forget(context.Background(), "absent", time.Time{}), "nothing to forget")
}

// The story: a message's handler runs in RunOnceTx; an operator, seeing
// the key claimed, forgets it from another process while the handler
// finishes; the broker redelivers the message to a third. The charge is
// made once.
func TestForgetDuringRunOnceTxThenRedeliveryChargesOnce(t *testing.T) {
	db := testDB(t)
	for _, expired := range []bool{false, true} {
		s, b, name := txFixture(t, db)
		if expired {
			expiredOutcome(t, b, "order-7")
		}
		charge := func(ctx context.Context, tx *sql.Tx) (int, error) {
			_, err := tx.ExecContext(ctx, "INSERT INTO "+name+" (note) VALUES ('order-7')")
			return 7, err
		}
		txErr, _ := forgetWhileTxEnds(t, db, s, b, "order-7", charge)
		require.NoError(t, txErr)

		third := idem.New[int](idem.Options{Backend: b})
		v, err := RunOnceTx(context.Background(), third, "order-7", "p", charge)
		third.Close()
		require.NoError(t, err)
		assert.Equal(t, 7, v)
		assert.Equal(t, 1, count(t, db, "SELECT count(*) FROM "+name), "order-7 charged once (over an expired outcome: %v)", expired)
	}
}
