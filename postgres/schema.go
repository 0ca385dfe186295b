package postgres

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The table's layout is shaped for Complete, the write every key gets
// after its claim: it sets state, expires_at, lease_until and the value,
// and no index holds any of them, so PostgreSQL can make it a HOT update
// (the new row version on the same page, no index entry added, the old
// one pruned without a vacuum). The sweep's index is on sweep_at, which
// the claim writes and Complete leaves as it is for the TTL the claim
// assumed: no later than the instant the record's outcome can expire
// (see Backend.Claim and learn). The primary key is the only other index.

// maxIdentifier is the longest identifier PostgreSQL keeps (NAMEDATALEN-1);
// it truncates longer ones.
const maxIdentifier = 63

// indexName is the name of table name's index with suffix: name+suffix,
// or, when that would be truncated (and could then be another table's
// index's name), a prefix of it and a hash of the whole name.
func indexName(name, suffix string) string {
	idx := strings.ReplaceAll(name, ".", "_") + suffix
	if len(idx) <= maxIdentifier {
		return idx
	}
	sum := sha256.Sum256([]byte(name))
	suffix = fmt.Sprintf("_%x%s", sum[:6], suffix)
	cut := maxIdentifier - len(suffix)
	for cut > 0 && !utf8.RuneStart(idx[cut]) { // never half a character
		cut--
	}
	return idx[:cut] + suffix
}

const (
	sweepSuffix  = "_sweep"
	legacySuffix = "_expiry" // the index on (expires_at) WHERE state = 2 of tables made before sweep_at
)

// storage is the table's storage parameters.
//
// fillfactor 90: a page's inserts stop at 90%, leaving room for the
// Completes of its rows to be HOT updates (measured: 85% HOT at 100, 100%
// at 90, with 300-byte values).
//
// autovacuum at 1% of the table dead, not 20%: every sweep leaves dead
// rows, and the default would let a table of 100M keys gather 20M of them
// between vacuums, each vacuum then scanning it all.
const storage = `fillfactor = 90, ` + autovacuum

const autovacuum = `autovacuum_vacuum_scale_factor = 0.01, autovacuum_analyze_scale_factor = 0.02`

// createTableSQL creates the table, if absent.
func createTableSQL(table string) string {
	return `CREATE TABLE IF NOT EXISTS ` + table + ` (
    key         text        PRIMARY KEY,
    fingerprint bytea       NOT NULL,
    token       text        NOT NULL,
    state       smallint    NOT NULL,
    created_at  timestamptz NOT NULL,
    expires_at  timestamptz,
    lease_until timestamptz,
    value       bytea,
    failed      boolean     NOT NULL DEFAULT false,
    err_msg     text        NOT NULL DEFAULT '',
    steps       bytea,
    sweep_at    timestamptz
) WITH (` + storage + `);`
}

// createIndexSQL creates the sweep's index, if absent.
func createIndexSQL(table, index string) string {
	return `CREATE INDEX IF NOT EXISTS ` + index + ` ON ` + table + ` (sweep_at);`
}

// createSQL is Schema for any table and index name.
func createSQL(table, index string) string {
	return createTableSQL(table) + "\n" + createIndexSQL(table, index)
}

// migrate creates the table and its index, and brings a table made by an
// earlier version to this layout, under a transaction-scoped advisory lock
// named after the table, so that replicas starting together take turns:
// CREATE ... IF NOT EXISTS alone is not safe to run concurrently (two
// sessions can both find the type absent and collide on the catalog's
// unique index). The one that waits sees, with a fresh snapshot, that the
// table is there. Every change is asked of the catalog first: ALTER TABLE
// takes an ACCESS EXCLUSIVE lock even when it changes nothing, which would
// stall every query on a busy table each time a replica starts.
func migrate(ctx context.Context, pool *pgxpool.Pool, table, name string) error {
	// Each try waits at most migrateLockWait for a lock on the table: an
	// ALTER queued behind a long transaction (an old replica's RunOnceTx)
	// would queue every query on the table behind it. A try that times
	// out (55P03) gives way, and the next comes after a pause, until ctx
	// ends.
	for wait := 100 * time.Millisecond; ; wait = min(2*wait, 5*time.Second) {
		err := migrateOnce(ctx, pool, table, name)
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "55P03" {
			return err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w (gave way to other transactions on the table until: %w)", err, ctx.Err())
		case <-t.C:
		}
	}
}

// migrateLockWait bounds each lock wait of a migration.
const migrateLockWait = "1s"

// migrateOnce is one try of migrate.
func migrateOnce(ctx context.Context, pool *pgxpool.Pool, table, name string) error {
	sweepIdx, legacyIdx := indexName(name, sweepSuffix), indexName(name, legacySuffix)
	// Read committed, whatever the session default: each statement after
	// the lock must see what the replica that held it before created.
	return pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, "idem migrate "+table); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '`+migrateLockWait+`'`); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, createTableSQL(table)); err != nil {
			return err
		}
		if err := addColumn(ctx, tx, table, "steps", "bytea", ""); err != nil {
			return err
		}
		// Not filled in: the rows from before sweep_at are found by the
		// sweep (Backend.Sweep's reaim) a batch at a time. An UPDATE of
		// every row here would hold ADD COLUMN's ACCESS EXCLUSIVE lock,
		// and stall the table, for as long as it takes.
		if err := addColumn(ctx, tx, table, "sweep_at", "timestamptz", ""); err != nil {
			return err
		}
		// Asked first: CREATE INDEX IF NOT EXISTS takes its SHARE lock,
		// which blocks writes, even when the index is there. And it skips
		// an index of that name on another table, whose sweep would then
		// scan this one whole.
		owner, _, err := indexOwner(ctx, tx, table, sweepIdx)
		if err != nil {
			return fmt.Errorf("finding its index %s: %w", sweepIdx, err)
		}
		switch owner {
		case theirs:
			return fmt.Errorf("the index name %s belongs to another table", sweepIdx)
		case absent:
			if _, err := tx.Exec(ctx, createIndexSQL(table, pgx.Identifier{sweepIdx}.Sanitize())); err != nil {
				return err
			}
		}
		// The old expiry index holds state and expires_at, which Complete
		// writes: while it stands no Complete is a HOT update.
		owner, qualified, err := indexOwner(ctx, tx, table, legacyIdx)
		if err != nil {
			return err
		}
		if owner == ours {
			if _, err := tx.Exec(ctx, `DROP INDEX `+qualified); err != nil {
				return err
			}
		}
		return setStorage(ctx, tx, table)
	})
}

// addColumn adds the column to a table that lacks it, and then runs fill,
// if any, to set it in the rows already there.
func addColumn(ctx context.Context, tx pgx.Tx, table, column, typ, fill string) error {
	var has bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_attribute
    WHERE attrelid = $1::text::regclass AND attname = $2 AND NOT attisdropped)`, table, column).Scan(&has); err != nil || has {
		return err
	}
	if _, err := tx.Exec(ctx, `ALTER TABLE `+table+` ADD COLUMN IF NOT EXISTS `+column+` `+typ); err != nil {
		return err
	}
	if fill != "" {
		_, err := tx.Exec(ctx, fill)
		return err
	}
	return nil
}

type indexOwnership int

const (
	absent indexOwnership = iota
	ours
	theirs
)

// indexOwner says whether an index named idx, in table's schema, exists
// and whether it is table's, and gives its name as SQL, qualified by its
// schema where the search path would not find it.
func indexOwner(ctx context.Context, tx pgx.Tx, table, idx string) (indexOwnership, string, error) {
	var mine *bool
	var qualified *string
	err := tx.QueryRow(ctx, `SELECT i.indrelid = $1::text::regclass, i.indexrelid::regclass::text FROM pg_index i WHERE i.indexrelid = (
    SELECT c.oid FROM pg_class c WHERE c.relname = $2 AND c.relnamespace = (SELECT relnamespace FROM pg_class WHERE oid = $1::text::regclass))`,
		table, idx).Scan(&mine, &qualified)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return absent, "", nil
	case err != nil:
		return absent, "", err
	case mine == nil || qualified == nil:
		return absent, "", nil
	case *mine:
		return ours, *qualified, nil
	}
	return theirs, *qualified, nil
}

// setStorage gives a table made before them the storage parameters,
// except those an operator set: any autovacuum setting of their own, or a
// fillfactor. SET takes a SHARE UPDATE EXCLUSIVE lock, which blocks no
// read or write; asked first all the same.
func setStorage(ctx context.Context, tx pgx.Tx, table string) error {
	var tuned, filled bool
	if err := tx.QueryRow(ctx, `SELECT coalesce(array_to_string(reloptions, ',') LIKE '%autovacuum_%', false),
    coalesce(array_to_string(reloptions, ',') LIKE '%fillfactor=%', false)
    FROM pg_class WHERE oid = $1::text::regclass`, table).Scan(&tuned, &filled); err != nil {
		return err
	}
	var set []string
	if !filled {
		set = append(set, `fillfactor = 90`)
	}
	if !tuned {
		set = append(set, autovacuum)
	}
	if len(set) == 0 {
		return nil
	}
	_, err := tx.Exec(ctx, `ALTER TABLE `+table+` SET (`+strings.Join(set, ", ")+`)`)
	return err
}
