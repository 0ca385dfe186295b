package postgres

import (
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"
)

// completeChecked is the outcome's statement in RunOnceTx's last round
// trip, which sends the COMMIT after it unread: the update of the claim
// (completeTx), made to fail when it updates no row, fn having deleted or
// rewritten the claim's row. The failure (a division by zero, 22012) stops
// the batch before the COMMIT, so fn's writes are never committed without
// their key.
func completeChecked(b *Backend) string {
	return `WITH done AS (` + b.q.completeTx + `) SELECT 1 / count(*) FROM done`
}

// refused reports whether err, from RunOnceTx's last round trip, is the
// server's refusal of one of its statements, after which it ran none of
// the rest (the COMMIT included): an ERROR of a class that answers the
// statement itself (data, constraint, transaction state, savepoint,
// conflict, syntax, limits). Any other failure (a connection lost, a
// pooler's answer for a server gone) leaves the COMMIT's fate unknown,
// which the server is asked about.
func refused(err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Severity != "ERROR" || len(pe.Code) != 5 {
		return false
	}
	switch pe.Code[:2] {
	case "0A", "22", "23", "25", "3B", "40", "42", "54", "55":
		return true
	}
	return false
}

// explainedTx says what a refusal of RunOnceTx's last round trip means.
func explainedTx(err error) error {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return err
	}
	switch pe.Code {
	case "22012": // completeChecked found no claim
		return fmt.Errorf("postgres: RunOnceTx's claim row was changed or deleted inside fn, so nothing was committed: %w", err)
	case "25P01", "3B001": // no transaction, or no savepoint: fn ended them
		return fmt.Errorf("postgres: the transaction ended inside fn (a COMMIT or ROLLBACK through it commits or rolls back the key with fn's writes), so the outcome was not recorded; if fn's writes committed, the key is left interrupted: %w", err)
	}
	return explained(err)
}

// unsent says what a failure of RunOnceTx's last round trip before any of
// it was sent means: no COMMIT went, so the transaction never committed
// and its claim goes with it. pgx sends nothing under a ctx that has
// ended (fn outlived the store's ExecutionTimeout), nor on a connection
// still busy with the rows of a query fn left open.
func unsent(err error) error {
	return fmt.Errorf("postgres: the outcome and the COMMIT were not sent (fn's time ran out, or it left the rows of a query open), so nothing was committed: %w", err)
}
