package postgres

import (
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
)

// A claim is called refused (nothing written, not read back) only for an
// error the server raises before the statement can take effect; a
// pooler's error for a server connection lost after the commit (08P01,
// helper-38) or a FATAL one is read back.
func TestAnsweredIsOnlyARefusalBeforeEffect(t *testing.T) {
	for code, want := range map[string]bool{
		"42703": true, "42601": true, "22001": true, "23505": true, "0A000": true, "25006": true, "55P03": true,
		"08P01": false, "08006": false, "57P01": false, "XX000": false, "53100": false, "40001": false,
	} {
		err := fmt.Errorf("claim: %w", &pgconn.PgError{Severity: "ERROR", Code: code})
		assert.Equal(t, want, answered(err), code)
	}
	assert.False(t, answered(&pgconn.PgError{Severity: "FATAL", Code: "42703"}), "FATAL")
	assert.False(t, answered(nil))
}
