package mysql

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/seed094d4201/idem/backend"
)

// retried runs f, which sends one statement outside any transaction of
// the caller's, and runs it again while it fails as a deadlock victim
// (1213) or cut short by one of the server's limits (cutShort: a lock
// wait, a statement's time), until ctx ends. The server rolls such a
// statement back, and running it again is what MySQL prescribes:
// concurrent inserts of one key, under the REPEATABLE READ default,
// deadlock on their next-key locks, and an insert meets the row lock of a
// RunOnceTx that holds the key for as long as its fn runs, however much
// longer than an operator's limits that is. The wait between attempts
// grows from 1 ms to 64 ms, with jitter, so that the conflicting callers
// do not meet again.
func retried[T any](ctx context.Context, f func() (T, error)) (T, error) {
	if err := ctx.Err(); err != nil {
		// Ended before the first send: nothing was sent, so the caller
		// has nothing to read back (backend.ErrRefused).
		var zero T
		return zero, backend.Refuse(err)
	}
	var conflict error // the last attempt's, while they conflict
	for attempt := 0; ; attempt++ {
		v, err := f()
		if !conflicted(err) {
			if conflict != nil && err != nil && ctx.Err() != nil {
				// ctx ended while the statement was sent again: what ended it
				// says nothing of the conflict that kept it retrying, and
				// the caller is told both.
				return v, fmt.Errorf("%w (sent %d times, the last cut short: %w)", conflict, attempt+1, err)
			}
			return v, explained(err)
		}
		conflict = err
		wait := time.Millisecond << min(attempt, 6)
		if perr := pause(ctx, wait/2+rand.N(wait)); perr != nil {
			return v, fmt.Errorf("%w (sent %d times, until: %w)", err, attempt+1, context.Cause(ctx))
		}
	}
}

// Server error numbers the backend tells apart.
const (
	errLockWaitTimeout = 1205 // ER_LOCK_WAIT_TIMEOUT
	errDeadlock        = 1213 // ER_LOCK_DEADLOCK
	errStatementTime   = 1969 // MariaDB's ER_STATEMENT_TIMEOUT: max_statement_time exceeded
	errExecutionTime   = 3024 // MySQL 8's ER_QUERY_TIMEOUT: max_execution_time exceeded (a SELECT)
	errNetPacketLarge  = 1153 // ER_NET_PACKET_TOO_LARGE: a request bigger than max_allowed_packet
	errPacketLarge     = 1301 // ER_WARN_ALLOWED_PACKET_OVERFLOWED: a result that would be
)

// conflicted reports whether err is the server's answer to a statement
// that lost a conflict with another and was rolled back.
func conflicted(err error) bool {
	if err == nil {
		return false // before me, which escapes: no allocation on success
	}
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == errDeadlock || cutShort(err)
}

// cutShort reports whether err is the server's answer to a statement it
// interrupted at one of its operator's limits, which it rolled back: a
// wait for another transaction's row lock longer than
// innodb_lock_wait_timeout (1205), or a statement longer than MariaDB's
// max_statement_time (1969) or MySQL's max_execution_time (3024). A
// statement of the backend's takes that long only when it waits on a
// lock: a RunOnceTx's uncommitted claim, held while its fn runs.
func cutShort(err error) bool {
	var me *mysql.MySQLError
	if err == nil || !errors.As(err, &me) {
		return false
	}
	switch me.Number {
	case errLockWaitTimeout, errStatementTime, errExecutionTime:
		return true
	}
	return false
}

// answered reports whether err is a refusal of a statement before it
// could take effect: the driver's, of a request larger than its
// maxAllowedPacket, which it never sends, or the server's, with a number
// raised while the statement is parsed or checked. Not any MySQLError: a
// proxy in between may answer a connection lost after the write with an
// error of its own, and a claim that landed must be read back, not
// reported refused.
func answered(err error) bool {
	if errors.Is(err, mysql.ErrPktTooLarge) {
		return true
	}
	var me *mysql.MySQLError
	if err == nil || !errors.As(err, &me) {
		return false
	}
	switch me.Number {
	case 1044, 1045, 1142, 1143, // access denied to the database, the user, the table, a column
		1046, 1049, 1054, 1064, 1146, // no database, unknown database or column, syntax, no such table
		1048, 1100, // a NULL in a NOT NULL column, a table not locked by the session's LOCK TABLES
		1264, 1366, 1406, // a value out of range, of the wrong type, too long
		1290, 1792, // a read-only server (--read-only), a read-only transaction
		errNetPacketLarge:
		return true
	}
	return false
}

// explained adds, to a refusal of a value larger than a packet may be,
// which setting decides it: the server's max_allowed_packet, and the
// driver's maxAllowedPacket (DSN parameter), whichever is smaller.
func explained(err error) error {
	var me *mysql.MySQLError
	switch {
	case err == nil:
		return nil
	case errors.Is(err, mysql.ErrPktTooLarge),
		errors.As(err, &me) && (me.Number == errNetPacketLarge || me.Number == errPacketLarge):
		return fmt.Errorf("%w (a value larger than max_allowed_packet: raise it on the server, and the driver's maxAllowedPacket in the DSN, or store less)", err)
	}
	return err
}
