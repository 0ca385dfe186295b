package multiproc

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"testing"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/internal/svctest"
	"github.com/seed094d4201/idem/mysql"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// holdMySQLTx is the child that holds key inside mysql.RunOnceTx, after a
// write to the effects table (in MySQL, in the same transaction), until
// it is killed.
func holdMySQLTx(ctx context.Context, b backend.Backend, key string) error {
	db, err := sql.Open("mysql", os.Getenv("IDEM_MYSQL_DSN"))
	if err != nil {
		return err
	}
	defer db.Close()
	store := idem.New[int](idem.Options{Backend: b})
	_, err = mysql.RunOnceTx(ctx, store, key, "p", func(ctx context.Context, tx *sql.Tx) (int, error) {
		if _, err := tx.ExecContext(ctx, "INSERT INTO "+os.Getenv(effectsEnv)+" (`key`, pid) VALUES (?, ?)", key, os.Getpid()); err != nil {
			return 0, err
		}
		fmt.Println("ready")
		select {} // until SIGKILL
	})
	return err
}

// A process killed inside mysql.RunOnceTx leaves neither its write nor
// the key: the server rolls the transaction back when the connection
// drops, and a claim of the key waits on its row lock until then.
func TestKilledMySQLTransaction(t *testing.T) {
	ctx := context.Background()
	db, err := sql.Open("mysql", svctest.MySQL(t))
	require.NoError(t, err)
	defer db.Close()
	table, effects := uniqueName("idem_tx_"), uniqueName("idem_effects_")
	dropMySQLLater(t, table)
	dropMySQLLater(t, effects)
	_, err = db.Exec("CREATE TABLE " + effects + " (`key` VARBINARY(255) NOT NULL, pid INT NOT NULL) ENGINE = InnoDB")
	require.NoError(t, err)
	b, closeB, err := openMySQL(ctx, table)
	require.NoError(t, err)
	defer closeB()

	startChild(t, childEnv+"=mysql", tableEnv+"="+table, effectsEnv+"="+effects, holdEnv+"=k", txEnv+"=1").kill(t)

	s := idem.New[int](idem.Options{Backend: b})
	defer s.Close()
	v, err := mysql.RunOnceTx(ctx, s, "k", "p", func(ctx context.Context, tx *sql.Tx) (int, error) {
		_, err := tx.ExecContext(ctx, "INSERT INTO "+effects+" (`key`, pid) VALUES ('k', 0)")
		return 1, err
	})
	require.NoError(t, err)
	assert.Equal(t, 1, v, "the key was free: this call ran")
	var n int
	require.NoError(t, db.QueryRow("SELECT count(*) FROM "+effects).Scan(&n))
	assert.Equal(t, 1, n, "only this call's write: the killed one left none")
}
