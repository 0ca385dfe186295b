package mysql

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"testing"
	"time"

	"github.com/seed094d4201/idem/backend"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A claim is an INSERT that a duplicate `key` refuses: that refusal is
// what makes one claim of a key win. A table made by the team's own tools
// (Options.NoMigrate), or restored with CREATE TABLE ... AS SELECT, which
// drops keys, can have every column and no unique index on `key`. Before,
// New accepted such a table, and every Claim of one key won: three owners
// of "k", three rows. PostgreSQL and SQLite refuse it (ON CONFLICT (key)
// needs a unique index); New must refuse it too.
func TestTableWithoutAUniqueKeyIsRefused(t *testing.T) {
	ctx := context.Background()
	db := testDB(t)
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	for _, index := range []struct{ name, sql string }{
		{"none", ""},
		{"not unique", ", INDEX k (`key`)"},
		{"unique with another column", ", UNIQUE INDEX k (`key`, token)"},
		{"unique on a prefix", ", UNIQUE INDEX k (`key`(8))"},
	} {
		t.Run(index.name, func(t *testing.T) {
			table := "idem_nokey_" + hex.EncodeToString(rnd[:]) + fmt.Sprint(len(index.sql))
			_, err := db.ExecContext(ctx, `CREATE TABLE `+table+` (
    `+"`key`"+` VARBINARY(255) NOT NULL, fingerprint BINARY(32) NOT NULL, token VARBINARY(255) NOT NULL,
    state TINYINT NOT NULL, created_at DATETIME(6) NOT NULL, expires_at DATETIME(6) NULL,
    lease_until DATETIME(6) NULL, value LONGBLOB NULL, failed BOOLEAN NOT NULL,
    err_msg LONGBLOB NOT NULL, steps LONGBLOB NULL, INDEX sweep (expires_at)`+index.sql+`) ENGINE = InnoDB`)
			require.NoError(t, err)
			t.Cleanup(func() { _, _ = db.Exec("DROP TABLE IF EXISTS " + table) })
			for _, noMigrate := range []bool{false, true} {
				b, err := New(ctx, db, Options{Table: table, NoMigrate: noMigrate})
				if err != nil {
					assert.ErrorContains(t, err, "unique")
					continue
				}
				winners := 0
				for i := range 3 {
					_, won, err := b.Claim(ctx, backend.Record{Key: "k", Token: fmt.Sprint("t", i), State: backend.StatePending}, time.Now(), time.Minute)
					if err == nil && won {
						winners++
					}
				}
				t.Errorf("New(NoMigrate: %v) accepted a table without a unique index on `key`: %d claims of one key won", noMigrate, winners)
			}
		})
	}
}
