package mysql

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"time"
)

// ended is rollback, reporting whether this call's own ROLLBACK ended
// tx, answered by the server: then no transaction is open on the session.
func (s *session) ended(tx *sql.Tx) bool {
	err := tx.Rollback()
	if err != nil && !errors.Is(err, sql.ErrTxDone) {
		s.spoiled = true
	}
	return err == nil
}

// release is close for a RunOnceTx's session. One whose transaction this
// call's own COMMIT or ROLLBACK ended, answered by the server (settled),
// has none open: turning autocommit on commits nothing, and close's
// ROLLBACK first would be a round trip for nothing. (A Tx whose ctx
// ended may have a ROLLBACK of database/sql's still queued behind a
// statement; its own Commit or Rollback then answers sql.ErrTxDone, never
// settled, and close rolls back first.)
func (s *session) release(ctx context.Context, timeout time.Duration, settled bool) {
	if !settled || s.spoiled {
		s.close(ctx, timeout)
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), max(timeout, time.Second))
	_, err := s.conn.ExecContext(ctx, `SET autocommit = 1, timestamp = DEFAULT`)
	cancel()
	if err != nil {
		// database/sql closes a connection whose Raw returns ErrBadConn.
		_ = s.conn.Raw(func(any) error { return driver.ErrBadConn })
	}
	_ = s.conn.Close()
}
