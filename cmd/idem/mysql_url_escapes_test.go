package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A mysql:// URL's user, password and database are percent-decoded and
// taken as they are, whatever bytes they decode to: the driver's DSN has
// no escapes, so a ':' in the user name used to move into the password,
// and a '?' in the database name cut it short, the rest read as a
// parameter (mysql://root@db/te%3Fst worked on the database "te").
func TestMySQLURLEscapedPartsAreTakenAsTheyAre(t *testing.T) {
	cfg, err := mysqlConfig("mysql://ops%3Aadmin:p%40ss%2Fw%3Ard@db.internal:3307/te%3Fst?parseTime=true")
	require.NoError(t, err)
	assert.Equal(t, "ops:admin", cfg.User)
	assert.Equal(t, "p@ss/w:rd", cfg.Passwd)
	assert.Equal(t, "db.internal:3307", cfg.Addr)
	assert.Equal(t, "te?st", cfg.DBName)
	assert.True(t, cfg.ParseTime)

	cfg, err = mysqlConfig("mysql://root@db/a%2Fb")
	require.NoError(t, err)
	assert.Equal(t, "a/b", cfg.DBName)
	assert.Equal(t, "root", cfg.User)
	assert.Empty(t, cfg.Passwd)
}
