package postgres

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Two tables of one schema whose names differ only in their last byte
// each get an expiry index of their own: the index is named after the
// schema and the table, which PostgreSQL truncated at 63 bytes to one name
// for both, and CREATE INDEX IF NOT EXISTS left the second table without
// one (its sweeps scanned it whole).
func TestLongTableNamesEachGetTheirIndex(t *testing.T) {
	pool := testPool(t)
	ctx := context.Background()
	var r [4]byte
	_, _ = rand.Read(r[:])
	schema := "idem_s_" + hex.EncodeToString(r[:])
	_, err := pool.Exec(ctx, `CREATE SCHEMA `+schema)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = pool.Exec(ctx, `DROP SCHEMA `+schema+` CASCADE`) })
	var tables []string
	for _, end := range []string{"a", "b"} {
		table := schema + "." + strings.Repeat("k", 60) + end
		_, err := New(ctx, pool, Options{Table: table})
		require.NoError(t, err)
		tables = append(tables, table)
	}
	for _, table := range tables {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_index WHERE indrelid = $1::text::regclass AND NOT indisprimary`, table).Scan(&n))
		assert.Equal(t, 1, n, "table %s has its expiry index", table)
	}
	_, err = New(ctx, pool, Options{Table: tables[1]})
	require.NoError(t, err, "again: New is idempotent")
}

// A table name PostgreSQL would truncate is refused: two such names would
// share one table.
func TestTableNameTooLong(t *testing.T) {
	pool := testPool(t)
	_, err := New(context.Background(), pool, Options{Table: strings.Repeat("t", 64)})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "longer than PostgreSQL's 63 bytes")
}

// An index of the expiry index's name on another table is found, not
// taken for this table's.
func TestIndexNameTakenByAnotherTable(t *testing.T) {
	pool := testPool(t)
	ctx := context.Background()
	var r [4]byte
	_, _ = rand.Read(r[:])
	table := "idem_taken_" + hex.EncodeToString(r[:])
	other := table + "_other"
	t.Cleanup(func() { _, _ = pool.Exec(ctx, `DROP TABLE IF EXISTS `+other+`, `+table) })
	_, err := pool.Exec(ctx, `CREATE TABLE `+other+` (x int); CREATE INDEX `+table+`_sweep ON `+other+` (x)`)
	require.NoError(t, err)
	_, err = New(ctx, pool, Options{Table: table})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "belongs to another table")
}

// The table vacuums at 1% dead rows, not PostgreSQL's 20%: a new table is
// made so, a table made before gets it, and an operator's own setting
// stays.
func TestAutovacuumSettings(t *testing.T) {
	pool := testPool(t)
	ctx := context.Background()
	opts := func(table string) string {
		var o *string
		require.NoError(t, pool.QueryRow(ctx, `SELECT array_to_string(reloptions, ',') FROM pg_class WHERE oid = $1::text::regclass`, table).Scan(&o))
		if o == nil {
			return ""
		}
		return *o
	}
	_, fresh := testBackend(t, pool)
	assert.Contains(t, opts(fresh), "autovacuum_vacuum_scale_factor=0.01")

	var r [4]byte
	_, _ = rand.Read(r[:])
	old, own := "idem_old_"+hex.EncodeToString(r[:]), "idem_own_"+hex.EncodeToString(r[:])
	t.Cleanup(func() { _, _ = pool.Exec(ctx, `DROP TABLE IF EXISTS `+old+`, `+own) })
	for _, table := range []string{old, own} {
		_, err := pool.Exec(ctx, strings.Replace(createSQL(table, table+"_sweep"), ` WITH (`+storage+`)`, ``, 1))
		require.NoError(t, err)
	}
	_, err := pool.Exec(ctx, `ALTER TABLE `+own+` SET (autovacuum_vacuum_scale_factor = 0.05)`)
	require.NoError(t, err)
	for _, table := range []string{old, own} {
		_, err := New(ctx, pool, Options{Table: table})
		require.NoError(t, err)
	}
	assert.Contains(t, opts(old), "autovacuum_vacuum_scale_factor=0.01")
	assert.Equal(t, "autovacuum_vacuum_scale_factor=0.05,fillfactor=90", opts(own), "the operator's setting stays; the fillfactor is added")
}

// An index name cut to 63 bytes is cut at a character's start: half a
// character is not valid UTF-8, which PostgreSQL refuses.
func TestIndexNameCutsWholeCharacters(t *testing.T) {
	pool := testPool(t)
	ctx := context.Background()
	table := "aa" + strings.Repeat("é", 29) // 60 bytes
	t.Cleanup(func() { _, _ = pool.Exec(ctx, `DROP TABLE IF EXISTS "`+table+`"`) })
	_, err := New(ctx, pool, Options{Table: table})
	require.NoError(t, err)
}

// Any autovacuum setting an operator chose keeps New's own off the table.
func TestAutovacuumKeepsAnOperatorsOtherSettings(t *testing.T) {
	pool := testPool(t)
	ctx := context.Background()
	b, table := testBackend(t, pool)
	_ = b
	_, err := pool.Exec(ctx, `ALTER TABLE `+table+` RESET (autovacuum_vacuum_scale_factor, autovacuum_analyze_scale_factor)`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `ALTER TABLE `+table+` SET (autovacuum_analyze_scale_factor = 0.5)`)
	require.NoError(t, err)
	_, err = New(ctx, pool, Options{Table: table})
	require.NoError(t, err)
	var o string
	require.NoError(t, pool.QueryRow(ctx, `SELECT array_to_string(reloptions, ',') FROM pg_class WHERE oid = $1::text::regclass`, table).Scan(&o))
	assert.Equal(t, "fillfactor=90,autovacuum_analyze_scale_factor=0.5", o)
}
