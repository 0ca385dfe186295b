package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// A PostgreSQL DSN in keyword/value form (host=... password=...) is not
// a WHERE idem takes, and is refused as a file that does not exist: the
// error must not print its password, as it printed the whole string
// (stat host=... password=s3cret ...), and it says what WHERE to give.
func TestKeywordDSNPasswordIsNotShown(t *testing.T) {
	for _, where := range []string{
		"host=127.0.0.1 user=app password=s3cret dbname=test",
		"host=127.0.0.1 password = 's3cret with spaces' dbname=test",
		"dbname=test PASSWORD=s3cret",
	} {
		code, out, errs := runCmd("inspect", where)
		assert.Equal(t, exitFailed, code, where)
		assert.Empty(t, out)
		assert.NotContains(t, errs, "s3cret", "the password is shown")
		assert.Contains(t, errs, "postgres://", "where to give a PostgreSQL DSN")
	}
}
