package postgres

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
)

// retried runs f, which sends one statement outside any transaction of
// the caller's, and runs it again while it fails with a serialization
// failure (40001) or a deadlock (40P01), until ctx ends. Under a
// SERIALIZABLE default (default_transaction_isolation, set for the server,
// a role or a database: the backend does not choose it for a statement it
// sends alone) concurrent claims, completions and sweeps of the same keys
// fail so; such a statement took no effect, and running it again is what
// PostgreSQL prescribes. The wait between attempts grows from 1 ms to
// 64 ms, with jitter, so that the conflicting callers do not meet again.
// A conflict that never ends (a trigger raising 40001) is retried until
// ctx ends, and the error then matches both the conflict and ctx's.
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
		if !pause(ctx, attempt) {
			return v, fmt.Errorf("%w (sent %d times, until: %w)", err, attempt+1, context.Cause(ctx))
		}
	}
}

// pause waits before attempt+1 of a statement: from 1 ms, doubling to
// 64 ms, with jitter. It returns false, at once, if ctx ends first.
func pause(ctx context.Context, attempt int) bool {
	wait := time.Millisecond << min(attempt, 6)
	t := time.NewTimer(wait/2 + rand.N(wait))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// awaited runs claim, which claims a key and may wait on its row, held by
// a transaction still open (a RunOnceTx elsewhere, running its fn, or
// taking the row over), and runs it again while the server cuts that wait
// short (waitedOut), until ctx ends: the key is in flight, and its
// duplicate waits for the transaction to end, as it does on a server
// without such a limit. claim must leave nothing behind when it fails
// (a statement sent alone, or a transaction of its own rolled back).
//
// A claim still cut short when ctx ends is refused (backend.ErrRefused:
// the server rolled it back) with an error that matches
// idem.ErrInProgress, the server's error and ctx's.
func awaited[T any](ctx context.Context, claim func() (T, error)) (T, error) {
	for attempt := 0; ; attempt++ {
		v, err := claim()
		if !waitedOut(ctx, err) {
			return v, err
		}
		if testHookWaitedOut != nil {
			testHookWaitedOut()
		}
		if !pause(ctx, attempt) {
			return v, backend.Refuse(fmt.Errorf("%w: its row is held by a transaction still open: the server cut the wait short %d times (%w), until: %w",
				idem.ErrInProgress, attempt+1, err, context.Cause(ctx)))
		}
	}
}

// waitedOut reports whether err is the server's end of a statement that
// waited longer than its operator allows, while ctx still lives: a
// statement_timeout (57014) or a lock_timeout (55P03), set for the role,
// the database or the server. A cancellation of our own, when ctx ends,
// also reads 57014: ctx tells them apart. The statement took no effect
// (it is rolled back, and with it any transaction it was in).
func waitedOut(ctx context.Context, err error) bool {
	if err == nil {
		return false // before pe, which escapes: no allocation on success
	}
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "57014" || pe.Code == "55P03") && ctx.Err() == nil
}

// conflicted reports whether err is PostgreSQL's answer to a statement
// that lost a conflict with another: a serialization failure or a
// deadlock.
func conflicted(err error) bool {
	if err == nil {
		return false // before pe, which escapes: no allocation on success
	}
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "40001" || pe.Code == "40P01")
}

// queryOne runs a query that returns at most one record, after any
// leading columns given as extra destinations, retried on a conflict.
func (b *Backend) queryOne(ctx context.Context, sql string, args []any, extra ...any) (backend.Record, bool, error) {
	f, err := retried(ctx, func() (f found, err error) {
		err = b.onConn(ctx, func(ctx context.Context, q querier) error {
			rows, err := q.Query(ctx, sql, args...)
			if err != nil {
				return err
			}
			f.rec, f.ok, err = scanOne(rows, extra...)
			return err
		})
		return f, err
	})
	return f.rec, f.ok, err
}

// explained adds, to PostgreSQL's refusal of a column that the table
// lacks, what the caller can do: a table made by an earlier version and
// opened with NoMigrate is brought up to date by the steps in schema.sql,
// or by New without NoMigrate.
func explained(err error) error {
	if err == nil {
		return nil // before pe, which escapes: no allocation on success
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "42703" { // undefined_column
		return fmt.Errorf("%w (the table is of an earlier layout: run the upgrade in schema.sql, or open it without Options.NoMigrate)", err)
	}
	return err
}

// answered reports whether err is the server's own refusal of a
// statement before it could take effect: an error of a class raised while
// the statement is planned or checked (42 syntax or an undefined column,
// 22 data, 23 a constraint, 0A unsupported, 25006 a read-only server,
// 55P03 a lock not available), at ERROR severity. Not any PgError: a
// connection pooler answers a server connection lost after the commit
// with an error response of its own (08P01), and a claim that committed
// must be read back, not reported refused (helper-38).
func answered(err error) bool {
	if err == nil {
		return false // before pe, which escapes: no allocation on success
	}
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Severity != "ERROR" || len(pe.Code) != 5 {
		return false
	}
	switch pe.Code[:2] {
	case "42", "22", "23", "0A":
		return true
	}
	return pe.Code == "25006" || pe.Code == "55P03"
}

// testHookWaitedOut, if set, runs each time awaited finds a claim cut
// short by the server's wait limit.
var testHookWaitedOut func()
