package mysql

import (
	"strings"
	"time"
)

// Every instant is the server's: the statements compute them from
// UTC_TIMESTAMP(6), which is the same for every session's time_zone and
// every caller's clock, and constant within one statement, or from an
// instant a statement made so (completeTx: the claim's); durations come
// as parameters, in microseconds. A session can move UTC_TIMESTAMP (SET
// timestamp): the backend's own statements run on sessions that have not
// (RunOnceTx's claim is made before fn runs, on a session reset for it).
// DATETIME(6) columns hold UTC and come back as microseconds since the
// Unix epoch, so that neither the driver's parseTime nor its loc can
// shift them.
const (
	serverNow = `UTC_TIMESTAMP(6)`
	// seen is the state column as the server's clock judges it: a pending
	// record whose lease lapsed is interrupted.
	seen = `CASE WHEN state = 1 AND lease_until <= ` + serverNow + ` THEN 3 ELSE state END`
	// expired is a completed record whose outcome may be forgotten.
	expired = `(state = 2 AND expires_at <= ` + serverNow + `)`
	// held is a pending record whose lease holds (or that has none).
	held = `state = 1 AND (lease_until IS NULL OR lease_until > ` + serverNow + `)`
	// seenColumns are a record's columns as scanRecord reads them: the
	// state as seen, the instants in microseconds, and whether it expired.
	seenColumns = "`key`, fingerprint, token, " + seen + `, ` + since + `created_at), ` + since + `expires_at), ` +
		since + `lease_until), value, failed, err_msg, steps, ` + expired
	epoch = `TIMESTAMP'1970-01-01 00:00:00'`
	since = `TIMESTAMPDIFF(MICROSECOND, ` + epoch + `, ` // + column + ")"
)

// orEmpty is the SQL for a bytes parameter that may be empty: a server
// whose sql_mode has EMPTY_STRING_IS_NULL makes an empty string NULL, a
// parameter too, which a NOT NULL column refuses (1048) and a comparison
// matches nothing with; it leaves an empty hex literal alone.
const orEmpty = `COALESCE(?, x'')`

// in is the SQL for the instant a parameter's microseconds after the
// server's now, or NULL for zero: no lease (INTERVAL NULL is NULL). A
// negative parameter is an instant before now: a lease that has lapsed
// already.
const in = serverNow + ` + INTERVAL NULLIF(?, 0) MICROSECOND`

// briefly makes stmt, which may meet another transaction's row lock (a
// RunOnceTx holds its uncommitted claim's until its fn returns), wait for
// it one second at most, the least innodb_lock_wait_timeout can be, not the
// session's 50 s default: a statement whose caller gave up (its connection
// closed) waits on at the server and would land later, a claim nobody
// runs or a Forget nobody asked for any more. A live caller sends it again
// (retried), for as long as its ctx allows. MariaDB sets a variable for one
// statement with SET STATEMENT; MySQL 8 with the SET_VAR hint, which
// MariaDB would ignore.
func briefly(stmt string, mariaDB bool) string {
	if mariaDB {
		return `SET STATEMENT innodb_lock_wait_timeout = 1 FOR ` + stmt
	}
	verb, rest, _ := strings.Cut(stmt, " ")
	return verb + ` /*+ SET_VAR(innodb_lock_wait_timeout = 1) */ ` + rest
}

// queries are the statements, written once for the table's name.
type queries struct {
	t                                                                                  string // the table, quoted
	claim, insert, get, claimTx, getTx, takeOver, complete, completeTx, release, renew string
	look, forget, exists, sweep, page, lockSteps, setSteps, resume                     string
}

func newQueries(t string, mariaDB bool) queries {
	insert := `INSERT INTO ` + t + " (`key`, fingerprint, token, state, created_at, lease_until, value, failed, err_msg)" + `
VALUES (?, ?, ?, 1, ` + epoch + ` + INTERVAL LAST_INSERT_ID(` + since + serverNow + `)) MICROSECOND, ` + in + `, NULL, FALSE, x'')
ON DUPLICATE KEY UPDATE state = state + LAST_INSERT_ID(0)`
	insert = briefly(insert, mariaDB)
	return queries{
		t: t,
		// The primary key decides, atomically, which of concurrent
		// inserts lands; the others change nothing (ON DUPLICATE KEY
		// UPDATE of a column to itself, which unlike INSERT IGNORE turns
		// no other error into a warning) and, on MariaDB, return the
		// record that stands: one round trip, whether the claim wins or
		// meets a replay. An insert that meets another transaction's
		// uncommitted claim of the key (a RunOnceTx) waits on its row
		// lock until that transaction ends.
		claim: insert + `
RETURNING ` + seenColumns,
		// MySQL 8 has no INSERT ... RETURNING: the insert, then get.
		insert: insert,
		// Every read of one key says LIMIT 1, though the key is unique:
		// an explicit LIMIT overrides the session's sql_select_limit,
		// which code sharing the pool may have SET (at 0, a read without
		// one finds no row).
		get: `SELECT ` + seenColumns + ` FROM ` + t + " WHERE `key` = ? LIMIT 1",
		// Inside RunOnceTx: the session's id comes back too, to ask
		// about its COMMIT if the reply to that is lost.
		claimTx: insert + `
RETURNING ` + seenColumns + `, CONNECTION_ID()`,
		getTx: `SELECT ` + seenColumns + `, CONNECTION_ID() FROM ` + t + " WHERE `key` = ? LIMIT 1",
		// Takes over a record that expired, atomically: the WHERE clause
		// is checked against the row as it stands when the UPDATE locks it.
		takeOver: briefly(`UPDATE `+t+` SET fingerprint = ?, token = ?, state = 1, created_at = `+serverNow+`, expires_at = NULL,
    lease_until = `+in+`, value = NULL, failed = FALSE, err_msg = x'', steps = NULL
WHERE `+"`key`"+` = ? AND `+expired, mariaDB),
		complete: `UPDATE ` + t + ` SET state = 2, expires_at = ` + serverNow + ` + INTERVAL ? MICROSECOND, lease_until = NULL,
    value = ?, failed = ?, err_msg = ` + orEmpty + `
WHERE ` + "`key`" + ` = ? AND token = ? AND state <> 2`,
		// Inside RunOnceTx, after fn, on the session fn used, whose clock
		// fn may have SET (timestamp, which UTC_TIMESTAMP follows): the
		// expiry is the claim's instant, made before fn ran, plus the
		// time since, measured by this process, and the TTL.
		completeTx: `UPDATE ` + t + ` SET state = 2, expires_at = created_at + INTERVAL ? MICROSECOND, lease_until = NULL,
    value = ?, failed = ?, err_msg = ` + orEmpty + `
WHERE ` + "`key`" + ` = ? AND token = ? AND state <> 2`,
		release: `DELETE FROM ` + t + " WHERE `key` = ? AND token = ? AND state <> 2",
		renew: `UPDATE ` + t + ` SET lease_until = ` + serverNow + ` + INTERVAL ? MICROSECOND
WHERE ` + "`key`" + ` = ? AND token = ? AND state = 1`,
		// Forget's first read: the record as last committed, a plain read
		// that never waits on a row lock.
		look: `SELECT token, state FROM ` + t + " WHERE `key` = ? LIMIT 1",
		// Forget deletes the record look read, unless its claim holds;
		// one that meets a RunOnceTx's row lock waits for it briefly, and
		// finds another token (the transaction's) once it commits.
		forget: briefly(`DELETE FROM `+t+" WHERE `key` = ? AND token = ? AND state = ? AND NOT ("+held+`)`, mariaDB),
		// Whether key has a record, read under a shared lock, which waits
		// briefly for a RunOnceTx's uncommitted claim of it.
		exists: briefly(`SELECT 1 FROM `+t+" WHERE `key` = ? LIMIT 1 LOCK IN SHARE MODE", mariaDB),
		// The index finds the expired records, oldest first. It runs in
		// a READ COMMITTED transaction (Sweep), so that it locks only the
		// rows it deletes, not the gaps between index entries, which
		// under REPEATABLE READ would hold up the claims inserted there
		// (their expires_at is NULL, next to the swept range).
		sweep: `DELETE FROM ` + t + ` WHERE state = 2 AND expires_at <= ` + serverNow + ` ORDER BY expires_at LIMIT ?`,
		page:  `SELECT ` + seenColumns + ` FROM ` + t + " WHERE `key` > " + orEmpty + " ORDER BY `key` LIMIT ?",
		// RecordStep's read: the steps of the claim token holds, locked
		// until its transaction ends, and the server's now for the step.
		lockSteps: `SELECT steps, ` + since + serverNow + `) FROM ` + t + `
WHERE ` + "`key`" + ` = ? AND token = ? AND ` + held + ` LIMIT 1 FOR UPDATE`,
		setSteps: `UPDATE ` + t + " SET steps = ? WHERE `key` = ? AND token = ?",
		// Takes over a record seen as interrupted, atomically: concurrent
		// Resumes queue on the row, and those after the first find
		// another token. (No UPDATE ... RETURNING in MySQL 8 nor in
		// MariaDB 10: Resume reads the record back by its new token.)
		resume: `UPDATE ` + t + ` SET token = ?, state = 1, lease_until = ` + in + `
WHERE ` + "`key`" + ` = ? AND token = ? AND ` + seen + ` = 3`,
	}
}

// micros is d in microseconds, the unit the statements take, rounded up:
// a positive lease or TTL never becomes zero, which means none.
func micros(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	n := int64(d / time.Microsecond)
	if d%time.Microsecond != 0 {
		n++
	}
	return n
}
