package mysql

import (
	"context"
	"crypto/rand"
	"database/sql"
	"database/sql/driver"
	"encoding/hex"
	"errors"
	"time"
)

// A session is the connection a RunOnceTx holds from its claim until its
// outcome is settled, taken from the pool for it alone: its server id
// (CONNECTION_ID) then names this transaction and no one else's, for as
// long as settling a lost COMMIT reply may need to ask about it or kill it.
//
// The session runs with autocommit off. A transaction can end on the
// server without fn ending it: a deadlock victim is rolled back whole,
// claim included. With autocommit on, fn's later statements through tx
// would then commit one by one, without the key; with it off they open a
// transaction of their own, which the call rolls back.
type session struct {
	conn *sql.Conn
	id   int64 // the server's CONNECTION_ID(), once the claim has read it
	// spoiled: the session's state is unknown (fn ended its transaction,
	// a statement failed on it, it was killed), so it is discarded, not
	// returned to the pool.
	spoiled bool
}

// openSession takes a connection from the pool, turns autocommit off and
// gives the session the server's clock (timestamp DEFAULT), whatever a
// user's statement on the shared pool SET: the claim's instant, from
// which the outcome's expiry runs, is the server's.
func (b *Backend) openSession(ctx context.Context) (*session, error) {
	conn, err := b.db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	s := &session{conn: conn}
	if _, err := conn.ExecContext(ctx, `SET autocommit = 0, timestamp = DEFAULT`); err != nil {
		s.spoiled = true
		s.close(ctx, 0)
		return nil, err
	}
	return s, nil
}

// close returns the session to the pool as the backend's own statements
// need it: its transaction rolled back, autocommit on, and the server's
// clock its own (fn may have SET timestamp, which UTC_TIMESTAMP follows);
// or it discards the session, if spoiled. A LOCK TABLES of fn's ends the
// transaction (spoiling the session), so it never reaches the pool either.
// Other session settings fn changes stay, as on any *sql.Tx's connection.
func (s *session) close(ctx context.Context, timeout time.Duration) {
	if !s.spoiled {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), max(timeout, time.Second))
		// ROLLBACK first: database/sql, when the work's ctx ends, marks
		// the Tx done and queues its own ROLLBACK behind a statement
		// still running, so a transaction may be open here though tx
		// says done; turning autocommit on would commit it. (After a
		// COMMIT it does nothing.)
		_, err := s.conn.ExecContext(ctx, `ROLLBACK`)
		if err == nil {
			_, err = s.conn.ExecContext(ctx, `SET autocommit = 1, timestamp = DEFAULT`)
		}
		cancel()
		s.spoiled = err != nil
	}
	if s.spoiled {
		// database/sql closes a connection whose Raw returns ErrBadConn.
		_ = s.conn.Raw(func(any) error { return driver.ErrBadConn })
	}
	_ = s.conn.Close()
}

// rollback ends tx, spoiling the session if that fails: a transaction that
// may still be open must not meet the autocommit that would commit it.
func (s *session) rollback(tx *sql.Tx) {
	if err := tx.Rollback(); err != nil && !errors.Is(err, sql.ErrTxDone) {
		s.spoiled = true
	}
}

// savepoint is the name of the savepoint fn runs in: one fn cannot guess,
// so cannot shadow or release by its own SAVEPOINT statements.
var savepoint = func() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "idem_fn_" + hex.EncodeToString(b[:])
}()
