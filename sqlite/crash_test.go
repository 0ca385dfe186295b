package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const crashFileEnv = "IDEM_SQLITE_FILE"

func init() {
	// in-tx: inside RunOnceTx on key "k", after fn's write, until
	// SIGKILL: it holds the file's write lock all that time.
	childModes["in-tx"] = func() error {
		db, err := Open(os.Getenv(crashFileEnv))
		if err != nil {
			return err
		}
		b, err := New(context.Background(), db, Options{})
		if err != nil {
			return err
		}
		if _, err := db.Exec(stockTable); err != nil {
			return err
		}
		s := idem.New[int](idem.Options{Backend: b})
		_, err = RunOnceTx(context.Background(), s, "k", "p", func(ctx context.Context, tx *sql.Tx) (int, error) {
			if _, err := tx.ExecContext(ctx, `INSERT INTO moves (note) VALUES ('k')`); err != nil {
				return 0, err
			}
			fmt.Println("ready")
			select {} // until SIGKILL
		})
		return fmt.Errorf("not killed in RunOnceTx: %v", err)
	}
}

// A process killed inside RunOnceTx, after fn wrote, leaves neither the
// write nor the key: the key is free, not interrupted, and the next call,
// from another process, runs.
func TestCrashInsideRunOnceTxLeavesNeither(t *testing.T) {
	path := filepath.Join(t.TempDir(), "idem.db")
	sigkill(t, startChild(t, "in-tx", crashFileEnv+"="+path))

	db, err := Open(path)
	require.NoError(t, err)
	defer db.Close()
	b, err := New(context.Background(), db, Options{})
	require.NoError(t, err)
	_, found, err := b.Get(context.Background(), "k", time.Now())
	require.NoError(t, err)
	assert.False(t, found, "the key is free")
	var rows int
	require.NoError(t, db.QueryRow(`SELECT count(*) FROM moves`).Scan(&rows))
	assert.Zero(t, rows, "fn's write is gone")

	s := idem.New[int](idem.Options{Backend: b})
	defer s.Close()
	v, err := RunOnceTx(context.Background(), s, "k", "p", func(ctx context.Context, tx *sql.Tx) (int, error) {
		_, err := tx.ExecContext(ctx, `INSERT INTO moves (note) VALUES ('k')`)
		return 7, err
	})
	require.NoError(t, err)
	assert.Equal(t, 7, v)
	require.NoError(t, db.QueryRow(`SELECT count(*) FROM moves`).Scan(&rows))
	assert.Equal(t, 1, rows)
}
